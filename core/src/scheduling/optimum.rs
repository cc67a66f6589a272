//! The cost of the cheapest plan for a small set of pods: the exact search
//! ([`super::exact`]) over the pods' classes, every node priced as the plan would launch it
//! in the cheapest NodePool that can take its pods together (taints tolerated, requirements
//! met, of the highest weight among the pools each pod can use, at most a class's per-node
//! cap of its hostname anti-affinity or spread group). What the search leaves out (zone
//! spread and affinity, limits, existing nodes) can only make a real plan dearer, so the figure is a lower bound that no plan beats, and the
//! cheapest plan itself for pods without such rules. `plan` reports R against it where the
//! fluid bound is too small to judge (fewer than ten nodes).

use std::collections::HashMap;

use crate::pod::Pod;
use crate::resources::{ResourceList, ResourceName};
use crate::taints::{self, Effect, Taint};

use super::classes::{self, CapGroup, Class};
use super::exact;
use super::input::{MinValuesPolicy, Snapshot, SolveOptions};
use super::price::Pricer;
use super::template::Template;
use super::view::{PodData, PodView};

/// The search runs on at most this many pods.
pub const OPTIMUM_MAX_PODS: usize = 50;
/// ... and at most this many states (see [`exact::states`]).
pub const OPTIMUM_STATES: usize = 20_000;

/// The cost of the cheapest plan for `pods[which]` on new nodes, `None` when the input is too
/// large for the exact search or some pod fits no pool.
pub fn optimum(snapshot: &Snapshot, pods: &[Pod], which: &[usize]) -> Option<f64> {
    if which.is_empty() || which.len() > OPTIMUM_MAX_PODS {
        return None;
    }
    let templates: Vec<Template<'_>> = snapshot
        .nodepools
        .iter()
        .enumerate()
        .filter_map(|(i, p)| Template::new(p, i, &snapshot.daemonsets, MinValuesPolicy::BestEffort).ok())
        .collect();
    let (classes, caps) = classes::build(pods, which);
    let counts: Vec<u32> = classes.iter().map(|c| c.pods.len() as u32).collect();
    if exact::states(&counts) > OPTIMUM_STATES {
        return None;
    }
    let opts = SolveOptions::default();
    let data: Vec<PodData> = classes
        .iter()
        .map(|c| {
            let p = &pods[c.pods[0]];
            PodData::new(p, &PodView::new(p), opts.preference_policy)
        })
        .collect();
    // Which templates each class may use: those it can use of the highest weight among them
    // (weight is a strict priority).
    let allowed: Vec<Vec<bool>> = classes
        .iter()
        .zip(&data)
        .map(|(c, d)| {
            let usable: Vec<bool> = templates
                .iter()
                .map(|t| {
                    tolerates_hard(&t.pool.taints, &pods[c.pods[0]].tolerations)
                        && t.requirements.is_compatible(&d.requirements, true)
                })
                .collect();
            let top = templates.iter().zip(&usable).filter(|(_, u)| **u).map(|(t, _)| t.pool.weight).max();
            templates.iter().zip(usable).map(|(t, u)| u && Some(t.pool.weight) == top).collect()
        })
        .collect();
    let rates = unit_rates(&templates, &classes, &allowed);
    let mut pricing = Pricing {
        templates: &templates,
        classes: &classes,
        caps: &caps,
        data: &data,
        allowed: &allowed,
        rates,
        pricer: Pricer::new(&opts),
    };
    exact::solve(&counts, &mut pricing, OPTIMUM_STATES).map(|(cost, _)| cost)
}

fn tolerates_hard(pool_taints: &[Taint], tolerations: &[taints::Toleration]) -> bool {
    let hard: Vec<Taint> = pool_taints.iter().filter(|t| t.effect != Effect::PreferNoSchedule).cloned().collect();
    taints::tolerates_all(&hard, tolerations)
}

/// Per class, per resource it requests: the least a unit costs on the types of the pools it
/// may use.
fn unit_rates(templates: &[Template<'_>], classes: &[Class], allowed: &[Vec<bool>]) -> Vec<Vec<(ResourceName, f64)>> {
    let mut per_template: HashMap<(usize, ResourceName), f64> = HashMap::new();
    classes
        .iter()
        .enumerate()
        .map(|(k, c)| {
            c.requests
                .iter()
                .filter(|(_, v)| *v > 0)
                .map(|(n, _)| {
                    let rate = (0..templates.len())
                        .filter(|&t| allowed[k][t])
                        .map(|t| {
                            *per_template.entry((t, n.clone())).or_insert_with(|| {
                                let tpl = &templates[t];
                                tpl.types
                                    .iter()
                                    .filter_map(|&ty| {
                                        let it = &tpl.instance_types[ty];
                                        let price = it.cheapest_price(&tpl.requirements);
                                        let alloc = it.allocatable.get(n);
                                        (price < f64::MAX && alloc > 0).then(|| price / alloc as f64)
                                    })
                                    .fold(f64::INFINITY, f64::min)
                            })
                        })
                        .fold(f64::INFINITY, f64::min);
                    (n.clone(), if rate.is_finite() { rate } else { 0.0 })
                })
                .collect()
        })
        .collect()
}

struct Pricing<'a, 't> {
    templates: &'a [Template<'t>],
    classes: &'a [Class],
    caps: &'a [CapGroup],
    data: &'a [PodData],
    allowed: &'a [Vec<bool>],
    rates: Vec<Vec<(ResourceName, f64)>>,
    pricer: Pricer,
}

impl exact::Pricing for Pricing<'_, '_> {
    fn price(&mut self, pods: &[u32]) -> Option<(f64, usize)> {
        // Per-node caps (hostname anti-affinity and spread groups).
        let mut per_group = vec![0u32; self.caps.len()];
        for (k, &n) in pods.iter().enumerate() {
            for &g in &self.classes[k].caps {
                per_group[g] += n;
            }
        }
        if per_group.iter().zip(self.caps).any(|(n, g)| *n as usize > g.cap) {
            return None;
        }
        let mut requests = ResourceList::new();
        for (k, &n) in pods.iter().enumerate() {
            if n > 0 {
                requests.add(&self.classes[k].requests.scaled(n as i64));
            }
        }
        let mut best: Option<(f64, usize)> = None;
        for (t, template) in self.templates.iter().enumerate() {
            if pods.iter().enumerate().any(|(k, &n)| n > 0 && !self.allowed[k][t]) {
                continue;
            }
            let mut reqs = template.requirements.clone();
            let mut ok = true;
            for (k, &n) in pods.iter().enumerate() {
                if n == 0 {
                    continue;
                }
                if reqs.compatible(&self.data[k].requirements, true).is_err() {
                    ok = false;
                    break;
                }
                reqs.add_all(&self.data[k].requirements);
            }
            if !ok {
                continue;
            }
            if let Some((p, _)) = self.pricer.price(template, t, &reqs, &requests, &[], None)
                && best.is_none_or(|(b, _)| p < b)
            {
                best = Some((p, t));
            }
        }
        best
    }

    fn lower(&self, pods: &[u32]) -> f64 {
        let mut per: HashMap<&ResourceName, f64> = HashMap::new();
        for (k, &n) in pods.iter().enumerate() {
            for (name, rate) in &self.rates[k] {
                *per.entry(name).or_insert(0.0) += n as f64 * self.classes[k].requests.get(name) as f64 * rate;
            }
        }
        per.values().copied().fold(0.0, f64::max)
    }
}
