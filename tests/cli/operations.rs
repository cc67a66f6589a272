//! What an operator runs against: the shipped alert rules, and the helpers that scrape and lint
//! a served `/metrics`.

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};

/// A free port on 127.0.0.1 for a server the test starts, below the kernel's ephemeral range
/// (32768 and up by default), so no outgoing connection takes it between this check and the
/// server's bind.
pub(crate) fn free_port() -> u16 {
    let start = 20_000 + (std::process::id() % 500) as u16 * 20;
    (start..32_000)
        .chain(20_000..start)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port below 32000")
}

/// `GET http://addr/metrics`, or `None` while nothing answers there.
pub(crate) fn get_metrics(addr: &str) -> Option<String> {
    let out = Command::new("curl").args(["-sf", "--max-time", "5", &format!("http://{addr}/metrics")]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `promtool check metrics` on `text` (Prometheus's own parser and lint).
pub(crate) fn promtool_check(text: &str) {
    #[allow(clippy::disallowed_methods, reason = "scripts/test names promtool for the tests")]
    let promtool = std::env::var("DOVETAIL_PROMTOOL")
        .expect("DOVETAIL_PROMTOOL names promtool (scripts/test installs it in ~/.cache/dovetail/bin)");
    let mut child = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs");
    child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("the scrape goes to promtool");
    let checked = child.wait_with_output().expect("promtool ends");
    assert!(
        checked.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
}

/// The shipped alert rules pass `promtool check rules`, and each names a runbook that
/// docs/operations.md has (its heading is the alert's name).
#[test]
fn the_shipped_alerts_pass_promtool_and_each_has_its_runbook() {
    #[allow(clippy::disallowed_methods, reason = "the checkout the test runs in, from cargo at run time")]
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    let rules = format!("{root}/deploy/prometheus/alerts.yaml");
    #[allow(clippy::disallowed_methods, reason = "scripts/test names promtool for the tests")]
    let promtool = std::env::var("DOVETAIL_PROMTOOL")
        .expect("DOVETAIL_PROMTOOL names promtool (scripts/test installs it in ~/.cache/dovetail/bin)");
    let out = Command::new(&promtool).args(["check", "rules", &rules]).output().expect("promtool runs");
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&rules).expect("the rules");
    let yaml: serde_yaml::Value = serde_yaml::from_str(&text).expect("YAML");
    let ops = std::fs::read_to_string(format!("{root}/docs/operations.md")).expect("docs/operations.md");
    let headings: BTreeSet<String> =
        ops.lines().filter_map(|l| l.strip_prefix("### ")).map(|h| h.trim().to_lowercase()).collect();
    let mut alerts = 0;
    for group in yaml["groups"].as_sequence().into_iter().flatten() {
        for rule in group["rules"].as_sequence().into_iter().flatten() {
            let name = rule["alert"].as_str().expect("an alert's name");
            let url = rule["annotations"]["runbook_url"].as_str().unwrap_or_default();
            assert_eq!(url, format!("docs/operations.md#{}", name.to_lowercase()), "{name}'s runbook");
            assert!(headings.contains(&name.to_lowercase()), "docs/operations.md has a `### {name}` runbook");
            alerts += 1;
        }
    }
    assert!(alerts >= 10, "{alerts} alerts");
}
