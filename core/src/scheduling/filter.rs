//! Narrowing a NodeClaim's instance types to those that meet its requirements, fit its
//! pods plus DaemonSet overhead and have an offering (Karpenter's
//! `filterInstanceTypesByRequirements`), with Karpenter's error messages.

use std::collections::BTreeSet;

use crate::catalog::InstanceType;
use crate::pod::HostPort;
use crate::requirements::Requirements;
use crate::resources::ResourceList;

/// Instance types of a template that the same set of DaemonSets would run on.
#[derive(Clone, Debug)]
pub struct DaemonGroup {
    /// Summed requests of the DaemonSets (with `pods`), empty when there are none.
    pub overhead: ResourceList,
    pub host_ports: Vec<HostPort>,
    /// Indices into the pool's instance types.
    pub types: Vec<usize>,
}

/// What to filter.
pub struct FilterInput<'x> {
    pub instance_types: &'x [InstanceType],
    /// Indices of the candidates (the claim's current types).
    pub candidates: &'x [usize],
    pub requirements: &'x Requirements,
    /// The new pod's requests, for messages.
    pub pod_requests: &'x ResourceList,
    /// Everything on the claim including the new pod.
    pub total_requests: &'x ResourceList,
    pub pod_ports: &'x [HostPort],
    /// Host ports of pods already on the claim.
    pub claim_ports: &'x [HostPort],
    pub groups: &'x [DaemonGroup],
    pub group_of: &'x [Option<usize>],
    pub relax_min_values: bool,
    /// Requirements every candidate is known to intersect (its pool's); only the keys
    /// where `requirements` goes beyond them are checked.
    pub base: Option<&'x Requirements>,
}

/// The types that remain, and `minValues` lowered under the BestEffort policy.
#[derive(Debug)]
pub struct Filtered {
    pub types: Vec<usize>,
    pub relaxed_min_values: Vec<(String, u32)>,
}

/// Why no instance type remained. `Display` gives Karpenter's message.
#[derive(Clone, Debug, Default)]
pub struct FilterError {
    requirements_met: bool,
    fits: bool,
    has_offering: bool,
    requirements_and_fits: bool,
    requirements_and_offering: bool,
    fits_and_offering: bool,
    min_values: Option<String>,
    requirements: String,
    pod_requests: ResourceList,
    min_daemon: Option<ResourceList>,
    max_daemon: Option<ResourceList>,
    cpu_typo: bool,
}

impl FilterError {
    fn resources(&self) -> String {
        match (&self.min_daemon, &self.max_daemon) {
            (Some(min), Some(max)) => {
                let lo = min.merged(&self.pod_requests).to_string();
                let hi = max.merged(&self.pod_requests).to_string();
                if lo == hi { lo } else { format!("min={lo}, max={hi}") }
            }
            _ => self.pod_requests.to_string(),
        }
    }
}

impl std::fmt::Display for FilterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tail = format!("requirements={}, resources={}", self.requirements, self.resources());
        if let Some(m) = &self.min_values {
            return write!(f, "{m}, {tail}");
        }
        let (r, fi, o) = (self.requirements_met, self.fits, self.has_offering);
        let msg = if !r && !fi && !o {
            "no instance type met the scheduling requirements or had enough resources or had a required offering"
        } else if !r && !fi {
            "no instance type met the scheduling requirements or had enough resources"
        } else if !r && !o {
            "no instance type met the scheduling requirements or had a required offering"
        } else if !fi && !o {
            "no instance type had enough resources or had a required offering"
        } else if !r {
            "no instance type met all requirements"
        } else if !fi {
            let typo = if self.cpu_typo { " (CPU request >= 1 Million, m vs M typo?)" } else { "" };
            return write!(f, "no instance type has enough resources, {tail}{typo}");
        } else if !o {
            "no instance type has the required offering"
        } else if self.requirements_and_fits {
            "no instance type which met the scheduling requirements and had enough resources, had a required offering"
        } else if self.fits_and_offering {
            "no instance type which had enough resources and the required offering met the scheduling requirements"
        } else if self.requirements_and_offering {
            "no instance type which met the scheduling requirements and the required offering had the required resources"
        } else {
            "no instance type met the requirements/resources/offering tuple"
        };
        write!(f, "{msg}, {tail}")
    }
}

fn ports_conflict(a: &[HostPort], b: &[HostPort]) -> bool {
    a.iter().any(|x| b.iter().any(|y| x.conflicts(y)))
}

/// Filters the candidates.
pub fn filter_instance_types(input: &FilterInput<'_>) -> Result<Filtered, Box<FilterError>> {
    // The report's strings are only made when nothing remains.
    let mut err = FilterError {
        requirements: String::new(),
        pod_requests: ResourceList::new(),
        cpu_typo: input.pod_requests.get(&crate::resources::ResourceName::Cpu) >= 1_000_000_000,
        ..Default::default()
    };
    // Per daemon group: skipped for host-port conflicts, else the total it needs.
    let group_totals: Vec<Option<ResourceList>> = input
        .groups
        .iter()
        .map(|g| {
            if ports_conflict(input.pod_ports, &g.host_ports) || ports_conflict(input.pod_ports, input.claim_ports) {
                return None;
            }
            if g.overhead.is_empty() {
                return Some(input.total_requests.clone());
            }
            Some(input.total_requests.merged(&g.overhead))
        })
        .collect();
    for (g, total) in input.groups.iter().zip(&group_totals) {
        if total.is_some() && !g.overhead.is_empty() {
            err.min_daemon = Some(err.min_daemon.take().map_or(g.overhead.clone(), |m| m.min_with(&g.overhead)));
            err.max_daemon = Some(err.max_daemon.take().map_or(g.overhead.clone(), |m| m.max_with(&g.overhead)));
        }
    }
    let mut remaining = Vec::new();
    let offering_filter = crate::catalog::OfferingFilter::new(input.requirements);
    let beyond = input.base.map(|b| input.requirements.keys_beyond(b));
    for &t in input.candidates {
        let Some(g) = input.group_of.get(t).copied().flatten() else { continue };
        let Some(total) = &group_totals[g] else { continue };
        let it = &input.instance_types[t];
        let compat = match &beyond {
            Some(keys) => it.requirements.intersects_ok_on(keys),
            None => it.requirements.intersects_ok(input.requirements),
        };
        let has_offering = it.offerings.iter().any(|o| offering_filter.accepts(o));
        let fits = has_offering && total.fits_in(&it.allocatable);
        err.requirements_met |= compat;
        err.fits |= fits;
        err.has_offering |= has_offering;
        err.requirements_and_fits |= compat && fits && !has_offering;
        err.requirements_and_offering |= compat && has_offering && !fits;
        err.fits_and_offering |= fits && has_offering && !compat;
        if compat && fits && has_offering {
            remaining.push(t);
        }
    }
    let mut relaxed = Vec::new();
    if input.requirements.has_min_values() {
        let unmet = unmet_min_values(input.instance_types, &remaining, input.requirements);
        if !unmet.is_empty() {
            if input.relax_min_values {
                relaxed = unmet;
            } else {
                let keys: Vec<&str> = unmet.iter().map(|(k, _)| k.as_str()).collect();
                err.min_values = Some(format!("minValues requirement is not met for label(s) [{}]", keys.join(" ")));
                remaining.clear();
            }
        }
    }
    if remaining.is_empty() {
        err.requirements = input.requirements.to_string();
        err.pod_requests = input.pod_requests.clone();
        return Err(Box::new(err));
    }
    Ok(Filtered { types: remaining, relaxed_min_values: relaxed })
}

/// Keys whose `minValues` the types do not cover, with how many values they do cover
/// (Karpenter's `SatisfiesMinValues`).
pub fn unmet_min_values(instance_types: &[InstanceType], types: &[usize], reqs: &Requirements) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for (key, req) in reqs.iter() {
        let Some(min) = req.min_values else { continue };
        let mut values: BTreeSet<&str> = BTreeSet::new();
        for &t in types {
            let r = instance_types[t].requirements.get(key);
            if !r.is_complement() {
                values.extend(r.values().iter().map(String::as_str));
            }
        }
        if (values.len() as u32) < min {
            out.push((key.to_string(), values.len() as u32));
        }
    }
    out
}
