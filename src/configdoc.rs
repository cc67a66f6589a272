//! `docs/configuration.md`, generated: every command's flags with their environment variables,
//! defaults and help as the CLI defines them, the controller's settings-file keys, and the
//! labels and annotations dovetail reads or writes. `dovetail config-doc > docs/configuration.md`
//! writes it; a test fails when the checked-in file is stale.

use clap::CommandFactory;

/// A label or annotation dovetail reads or writes, with what it does.
struct Key {
    name: &'static str,
    on: &'static str,
    what: &'static str,
}

/// The labels and annotations users set or see; the names are the code's constants.
fn keys() -> Vec<Key> {
    use dovetail_core::cluster::TERMINATION_FINALIZER;
    use dovetail_core::labels;
    vec![
        Key {
            name: labels::NODEPOOL,
            on: "Node, NodeClaim (label)",
            what: "The NodePool that made it. Nodes with it are never chosen for dovetail's own pods.",
        },
        Key {
            name: labels::INITIALIZED,
            on: "Node (label)",
            what: "Set once the node is Ready, its startup taints gone and its extended resources registered.",
        },
        Key { name: labels::CAPACITY_TYPE, on: "Node (label)", what: "`spot` or `on-demand`." },
        Key {
            name: "karpenter.sh/do-not-disrupt",
            on: "Pod, Node (annotation)",
            what: "`\"true\"`: no voluntary disruption of the node (drift, emptiness, consolidation) while the pod runs on it.",
        },
        Key {
            name: "karpenter.sh/nodepool-hash",
            on: "NodePool, NodeClaim (annotation)",
            what: "The hash of the NodePool's template the claim was made from (drift).",
        },
        Key {
            name: "dovetail.dev/disruption-rate",
            on: "NodePool (annotation)",
            what: "`N/DURATION` (e.g. `5/10m`): at most N nodes of the pool start disrupting in any DURATION, beside the budgets; enforced by the ledger.",
        },
        Key {
            name: dovetail_core::pod::MIRROR_ANNOTATION,
            on: "Pod (annotation; or a `v1` Node owner reference)",
            what: "A static pod's mirror: never evicted or waited for by a drain, never counted when a node is checked for emptiness, never provisioned for (the kubelet writes it again when deleted).",
        },
        Key {
            name: dovetail_core::disruption::candidates::DELETION_COST_ANNOTATION,
            on: "Pod (annotation)",
            what: "Makes a pod cheaper (negative) or dearer to move in the disruption cost that orders consolidation candidates, as Karpenter's.",
        },
        Key {
            name: "karpenter.sh/disrupted",
            on: "Node (taint, NoSchedule)",
            what: "Put on a node being disrupted or interrupted before it is drained.",
        },
        Key {
            name: TERMINATION_FINALIZER,
            on: "Node, NodeClaim (finalizer)",
            what: "Held until the node is drained and its instance terminated.",
        },
        Key {
            name: dovetail_cloud::TAG_CLUSTER_PREFIX,
            on: "EC2 instance (tag key prefix, `<prefix><cluster>: owned`)",
            what: "Instances with it and `karpenter.sh/nodepool` are dovetail's: garbage collection terminates those no NodeClaim knows, after 30 s. The cluster's tag alone (a managed node group's) is never touched.",
        },
        Key {
            name: dovetail_cloud::TAG_LAUNCH_BATCH,
            on: "EC2 instance (tag)",
            what: "The ledger's launch batch that made it: a new leader finds in-flight launches by it.",
        },
    ]
}

/// `--kebab-case` to the settings file's `camelCase`.
fn camel(long: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in long.chars() {
        if c == '-' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// One line of text (a table cell): help paragraphs joined, pipes escaped.
fn cell(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|")
}

/// The flags of a command as a table; `file_keys` adds the settings file's column.
fn table(out: &mut String, cmd: &clap::Command, file_keys: bool) {
    let args: Vec<&clap::Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && a.get_long().is_some() && !a.is_global_set())
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .collect();
    if args.is_empty() {
        out.push_str("No flags.\n\n");
        return;
    }
    if file_keys {
        out.push_str("| Flag | Environment | Settings file key | Default | What it does |\n|---|---|---|---|---|\n");
    } else {
        out.push_str("| Flag | Environment | Default | What it does |\n|---|---|---|---|\n");
    }
    for a in args {
        let long = a.get_long().unwrap_or_default();
        let value = a.get_value_names().and_then(|v| v.first()).map(|v| format!(" {v}")).unwrap_or_default();
        let takes = a.get_num_args().is_some_and(|n| n.takes_values());
        let flag = format!("`--{long}{}`", if takes { value } else { String::new() });
        let env = a.get_env().map(|e| format!("`{}`", e.to_string_lossy())).unwrap_or_default();
        let default: Vec<String> = a.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
        let default = if default.is_empty() { String::new() } else { format!("`{}`", default.join(",")) };
        let mut help = a.get_long_help().or(a.get_help()).map(|h| cell(&h.to_string())).unwrap_or_default();
        let values: Vec<String> = a
            .get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| format!("`{}`", v.get_name()))
            .collect();
        if !values.is_empty() && takes {
            if !help.is_empty() && !help.ends_with('.') {
                help.push('.');
            }
            help += &format!(" One of {}.", values.join(", "));
        }
        if file_keys {
            let key = if long == "config" { String::new() } else { format!("`{}`", camel(long)) };
            out.push_str(&format!("| {flag} | {env} | {key} | {default} | {help} |\n"));
        } else {
            out.push_str(&format!("| {flag} | {env} | {default} | {help} |\n"));
        }
    }
    out.push('\n');
}

/// The whole document.
pub fn render() -> String {
    let mut cli = crate::Cli::command();
    // Value names, arities and possible values are filled in by the build.
    cli.build();
    let mut out = String::from(
        "# Configuration\n\n\
         <!-- Generated by `dovetail config-doc` from the CLI's definitions; do not edit. A test \
         fails when this file is stale. -->\n\n\
         Every flag, its environment variable and its default, by command. The controller also \
         reads a settings file (`--config FILE`, YAML): its keys are the flags' names in \
         camelCase, and flags and environment variables override it. `RUST_LOG` overrides \
         `--log-level`.\n\n",
    );
    out.push_str("## Every command\n\nThese flags go with any command.\n\n");
    let globals: Vec<&clap::Arg> = cli.get_arguments().filter(|a| a.is_global_set()).collect();
    let mut global = clap::Command::new("global");
    for a in globals {
        global = global.arg(a.clone().global(false));
    }
    table(&mut out, &global, false);
    for sub in cli.get_subcommands().filter(|s| !s.is_hide_set()) {
        out += &format!("## `dovetail {}`\n\n", sub.get_name());
        if let Some(about) = sub.get_long_about().or(sub.get_about()) {
            out += &format!("{}\n\n", cell(&about.to_string()));
        }
        table(&mut out, sub, sub.get_name() == "controller");
        for nested in sub.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
            out += &format!("### `dovetail {} {}`\n\n", sub.get_name(), nested.get_name());
            if let Some(about) = nested.get_long_about().or(nested.get_about()) {
                out += &format!("{}\n\n", cell(&about.to_string()));
            }
            table(&mut out, nested, false);
        }
    }
    out.push_str(
        "## Labels, annotations, taints, finalizers and tags\n\n| Name | On | What it does |\n|---|---|---|\n",
    );
    for k in keys() {
        out += &format!("| `{}` | {} | {} |\n", k.name, k.on, cell(k.what));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::disallowed_methods, reason = "the checkout the test runs in, from cargo at run time")]
    fn checked_in() -> String {
        let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
        std::fs::read_to_string(std::path::Path::new(&dir).join("docs/configuration.md")).unwrap_or_default()
    }

    #[test]
    fn the_checked_in_configuration_doc_is_what_the_cli_generates() {
        let generated = render();
        assert!(
            generated == checked_in(),
            "docs/configuration.md is stale: run `cargo run -- config-doc > docs/configuration.md` and commit it"
        );
    }

    #[test]
    fn every_controller_flag_is_a_key_of_the_settings_file() {
        let cli = crate::Cli::command();
        let controller = cli.find_subcommand("controller").expect("the controller command");
        let mut keys = 0;
        for a in controller.get_arguments().filter(|a| !a.is_global_set()) {
            let Some(long) = a.get_long().filter(|l| !matches!(*l, "config" | "help")) else { continue };
            let yaml = format!("{}: null\n", camel(long));
            let parsed: Result<crate::controller::settings::FileSettings, _> = serde_yaml::from_str(&yaml);
            assert!(parsed.is_ok(), "--{long} has no settings-file key {}: {parsed:?}", camel(long));
            keys += 1;
        }
        assert!(keys > 20, "{keys} keys");
    }

    #[test]
    fn the_doc_names_every_command_and_the_flags_the_issues_named() {
        let doc = render();
        for flag in
            ["--metrics-addr", "--log-format", "--log-level", "--gc-interval", "--interruption-queue", "--peers"]
        {
            assert!(doc.contains(&format!("`{flag}")), "{flag} in the doc");
        }
        for cmd in ["plan", "simulate", "loadtest", "controller", "explain", "ledger"] {
            assert!(doc.contains(&format!("## `dovetail {cmd}`")), "{cmd} in the doc");
        }
        assert_eq!(camel("interruption-queue"), "interruptionQueue");
    }
}
