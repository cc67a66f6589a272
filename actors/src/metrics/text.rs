//! The Prometheus text format: what prometheus-client's OpenMetrics becomes, and reading a
//! series back out of a scrape (for tests and reports).

/// The sum of the samples of `series` whose labels include all of `labels`, in Prometheus
/// text.
pub fn sum_of(text: &str, series: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name_labels, value) = l.rsplit_once(' ')?;
            let (name, rest) = match name_labels.split_once('{') {
                Some((n, r)) => (n, r),
                None => (name_labels, ""),
            };
            if name != series {
                return None;
            }
            let all = labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
            if all { value.parse::<f64>().ok() } else { None }
        })
        .sum()
}

/// prometheus-client writes OpenMetrics; scrapers and promtool also read the older
/// Prometheus text format, which differs in three ways handled here: a counter's HELP and
/// TYPE name the series with its `_total` suffix, there is no `# UNIT` line, and no `# EOF`.
pub fn to_prometheus_text(open_metrics: &str) -> String {
    let mut out = String::with_capacity(open_metrics.len());
    let lines: Vec<&str> = open_metrics.lines().collect();
    let counters: std::collections::HashSet<&str> =
        lines.iter().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    for line in lines {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            counters.contains(name).then(|| format!("{prefix}{name}_total {tail}"))
        });
        match renamed {
            Some(l) => out.push_str(l.trim_end()),
            // A series without labels is written bare (`name 1`, not `name{} 1`).
            None => out.push_str(&line.replacen("{} ", " ", 1)),
        }
        out.push('\n');
    }
    out
}
