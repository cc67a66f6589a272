//! What a node would cost: the price a claim with given requirements and contents would
//! launch at once right-sized ([`super::right_size`]: every type of its pool that meets
//! its requirements and fits its pods with their DaemonSets, cheapest first) and launched
//! ([`super::launch`]: the AWS provider's filters and choice). The improve stage and the
//! exact search price every move and every candidate node with it, so their figures are
//! the plan's figures.

use std::collections::HashMap;
use std::rc::Rc;

use crate::catalog::{CapacityType, OfferingFilter};
use crate::pod::HostPort;
use crate::requirements::Requirements;
use crate::resources::ResourceList;

use super::input::SolveOptions;
use super::launch::{Market, Rung, launch_price_and_type};
use super::right_size::PriceOrder;
use super::template::Template;

/// Per-solve memo of each (template, requirements)'s candidate rungs in right-sizing order.
pub struct Pricer {
    order: PriceOrder,
    /// Per template, per requirements.
    rungs: Vec<HashMap<Requirements, Rc<Vec<Rung>>>>,
    max_types: usize,
    max_launch: usize,
}

impl Pricer {
    /// A pricer with the solve's truncations (types kept per claim, types per launch).
    pub fn new(opts: &SolveOptions) -> Self {
        Pricer {
            order: PriceOrder::default(),
            rungs: Vec::new(),
            max_types: opts.max_instance_types,
            max_launch: opts.max_launch_types,
        }
    }

    /// The template's types that meet `reqs` and have an offering they allow, as rungs in
    /// right-sizing order.
    pub fn rungs(&mut self, template: &Template<'_>, t: usize, reqs: &Requirements) -> Rc<Vec<Rung>> {
        if let Some(r) = self.rungs.get(t).and_then(|m| m.get(reqs)) {
            return r.clone();
        }
        let its = template.instance_types;
        let filter = OfferingFilter::new(reqs);
        let rungs: Vec<Rung> = self
            .order
            .by_price(template, t, reqs.clone())
            .iter()
            .map(|&ty| {
                let (mut spot, mut od) = (f64::MAX, f64::MAX);
                for o in its[ty].offerings.iter().filter(|o| filter.accepts(o)) {
                    match o.capacity_type {
                        CapacityType::Spot => spot = spot.min(o.price),
                        CapacityType::OnDemand => od = od.min(o.price),
                        CapacityType::Reserved => {}
                    }
                }
                Rung { ty, key: spot.min(od), spot, od, exotic: its[ty].exotic }
            })
            .collect();
        let rungs = Rc::new(rungs);
        if self.rungs.len() <= t {
            self.rungs.resize_with(t + 1, HashMap::new);
        }
        self.rungs[t].insert(reqs.clone(), rungs.clone());
        rungs
    }

    /// The launch price and type of a node of template `t` with requirements `reqs` (its
    /// hostname placeholder left out) holding pods that request `requests` and bind
    /// `ports`, its candidates no larger than `cap` in the resources `cap` names; `None`
    /// when no type can take them.
    pub fn price(
        &mut self,
        template: &Template<'_>,
        t: usize,
        reqs: &Requirements,
        requests: &ResourceList,
        ports: &[HostPort],
        cap: Option<&ResourceList>,
    ) -> Option<(f64, usize)> {
        let rungs = self.rungs(template, t, reqs);
        let its = template.instance_types;
        let need = template.need(requests);
        let ports_ok: Vec<bool> = template
            .daemon_groups
            .iter()
            .map(|g| !ports.iter().any(|p| g.host_ports.iter().any(|q| p.conflicts(q))))
            .collect();
        let fitting = rungs.iter().copied().filter(|r| {
            template.group_of[r.ty].is_some_and(|g| ports_ok[g])
                && template.fits(&need, r.ty)
                && cap.is_none_or(|cap| cap.iter().all(|(n, v)| its[r.ty].capacity.get(n) <= v))
        });
        launch_price_and_type(fitting, Market::of(reqs), self.max_types, self.max_launch)
    }
}
