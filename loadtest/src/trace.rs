//! Trace replay: a CSV in the normalized schema of the shared traces
//! (`pod_id,cpu_milli,memory_mib,gpu,gpu_milli,gpu_model,arrival_s,departure_s`, columns found
//! by name) becomes a scenario: each row a pod created at its arrival and deleted at its
//! departure, or, with `batch`, every pod pending at once and none leaving.

use std::time::Duration;

use dovetail_api::manifest::Manifest;

use crate::scenario::{Scenario, ScenarioError, Thresholds, Workload};

/// One row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TracePod {
    pub id: String,
    pub cpu_milli: i64,
    pub memory_mib: i64,
    pub gpus: i64,
    pub arrival_s: u64,
    pub departure_s: Option<u64>,
}

/// Parses a trace; errors name the line and column.
pub fn parse(text: &str) -> Result<Vec<TracePod>, String> {
    let mut lines = text.lines();
    let header = lines.next().ok_or("empty trace")?;
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    let col = |name: &str| cols.iter().position(|c| *c == name).ok_or(format!("no {name} column in the header"));
    let (id, ci, mi, gi, ai, di) =
        (col("pod_id")?, col("cpu_milli")?, col("memory_mib")?, col("gpu")?, col("arrival_s")?, col("departure_s")?);
    let mut out = Vec::new();
    for (n, line) in lines.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let num = |i: usize| -> Result<u64, String> {
            f.get(i).and_then(|v| v.parse().ok()).ok_or(format!(
                "line {}: column {} is not a non-negative integer",
                n + 2,
                cols[i]
            ))
        };
        let signed = |i: usize| num(i).and_then(|v| i64::try_from(v).map_err(|e| format!("line {}: {e}", n + 2)));
        let departure_s = match f.get(di) {
            None | Some(&"") => None,
            Some(_) => Some(num(di)?),
        };
        out.push(TracePod {
            id: f.get(id).map(|s| s.to_string()).unwrap_or_default(),
            cpu_milli: signed(ci)?,
            memory_mib: signed(mi)?,
            gpus: signed(gi)?,
            arrival_s: num(ai)?,
            departure_s,
        });
    }
    Ok(out)
}

/// The scenario replaying `pods` against the NodePools (and EC2NodeClasses) of `cluster`.
pub fn scenario(
    name: &str,
    pods: &[TracePod],
    cluster: &str,
    zones: Vec<String>,
    batch: bool,
) -> Result<Scenario, ScenarioError> {
    let err = |field: &str, message: String| ScenarioError { scenario: name.into(), field: field.into(), message };
    let manifest = Manifest::parse(cluster).map_err(|e| err("nodepools", e.to_string()))?;
    if manifest.nodepools.is_empty() {
        return Err(err("nodepools", "no NodePool".into()));
    }
    let mut workloads = Vec::new();
    let mut end = 0u64;
    for (i, p) in pods.iter().enumerate() {
        let name = if p.id.is_empty() { format!("trace-{i}") } else { format!("trace-{i}-{}", sanitize(&p.id)) };
        let at = if batch { 0 } else { p.arrival_s.saturating_mul(1000) };
        workloads.push((
            at,
            Workload::Pod { name: name.clone(), cpu_milli: p.cpu_milli, memory: p.memory_mib << 20, gpus: p.gpus },
        ));
        end = end.max(at);
        if !batch && let Some(d) = p.departure_s {
            let d = d.saturating_mul(1000).max(at);
            workloads.push((d, Workload::DeletePod { name }));
            end = end.max(d);
        }
    }
    workloads.sort_by_key(|(at, _)| *at);
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    Ok(Scenario {
        name: name.into(),
        region: "us-east-1".into(),
        zones,
        // Time to place what came last.
        duration: end.saturating_add(ms(Duration::from_secs(600))),
        // 10 s, or coarser for traces spanning weeks (at most 20,000 steps).
        tick: ms(Duration::from_secs(10)).max(end / 20_000),
        sample: ms(Duration::from_secs(60)).max(end / 500),
        registration_delay: ms(Duration::from_secs(30)),
        window: dovetail_core::plane::BatchWindow::default(),
        // A trace's pods are bare (no controller makes them again): a drain would lose them.
        disruption: false,
        cluster: manifest,
        workloads,
        faults: Vec::new(),
        api_limits_factor: 1.0,
        thresholds: Thresholds::default(),
        control: None,
        edits: None,
        releases: None,
        virtual_time: false,
    })
}

/// A pod id as a DNS label part.
fn sanitize(id: &str) -> String {
    id.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "pod_id,cpu_milli,memory_mib,gpu,gpu_milli,gpu_model,arrival_s,departure_s\n\
        a,500,1024,0,0,,0,600\n\
        b,1000,2048,0,0,,30,\n\
        c,250,512,0,0,,60,60\n";

    const POOLS: &str = "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {name: default}\nspec:\n  template:\n    spec:\n      nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n      requirements:\n        - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}\n";

    #[test]
    fn rows_become_arrivals_and_departures_or_one_batch() {
        let pods = parse(TRACE).expect("trace");
        assert_eq!(pods.len(), 3);
        assert_eq!(pods[1].departure_s, None);
        let zones = vec!["us-east-1a".to_string()];
        let s = scenario("t", &pods, POOLS, zones.clone(), false).expect("scenario");
        let kinds: Vec<(u64, bool)> =
            s.workloads.iter().map(|(at, w)| (*at, matches!(w, Workload::DeletePod { .. }))).collect();
        assert_eq!(kinds, vec![(0, false), (30_000, false), (60_000, false), (60_000, true), (600_000, true)]);
        assert_eq!(s.duration, 1_200_000);
        let b = scenario("t", &pods, POOLS, zones, true).expect("batch");
        assert!(b.workloads.iter().all(|(at, w)| *at == 0 && matches!(w, Workload::Pod { .. })));
        assert_eq!(b.workloads.len(), 3);
    }

    #[test]
    fn errors_name_the_line_and_column() {
        let e = parse("pod_id,cpu_milli,memory_mib,gpu,arrival_s,departure_s\nx,lots,1,0,0,\n").expect_err("bad");
        assert_eq!(e, "line 2: column cpu_milli is not a non-negative integer");
        assert!(parse("pod_id,cpu\n").expect_err("header").contains("no cpu_milli column"));
        let pods = parse(TRACE).expect("trace");
        let e = scenario("t", &pods, "", vec![], false).expect_err("no pools");
        assert_eq!(e.field, "nodepools");
    }
}
