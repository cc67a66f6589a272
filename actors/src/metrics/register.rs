//! The registry's families: every series [`Metrics`] counts, registered under Karpenter's
//! names and help texts (or dovetail's), with Karpenter's buckets.

use std::sync::Mutex;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::{Histograms, Labels, Metrics, budgets, duration_histogram};

impl Metrics {
    pub fn new() -> Self {
        let histograms = || Histograms::new_with_constructor(duration_histogram as fn() -> Histogram);
        let m = Metrics {
            registry: Mutex::new(Registry::default()),
            nodeclaims_created: Family::default(),
            nodeclaims_terminated: Family::default(),
            nodeclaims_disrupted: Family::default(),
            nodes_created: Family::default(),
            nodes_terminated: Family::default(),
            disruption_decisions: Family::default(),
            scheduling_duration: histograms(),
            provisioner_scheduling_duration: duration_histogram(),
            cloud_duration: histograms(),
            cloud_errors: Family::default(),
            launch_failures: Family::default(),
            interruption_received: Family::default(),
            interruption_deleted: Counter::default(),
            interruption_unmatched: Counter::default(),
            interruption_queue_duration: duration_histogram(),
            proposals: Family::default(),
            proposal_duration: histograms(),
            commit_index: Gauge::default(),
            failovers: Counter::default(),
            collected: Counter::default(),
            collected_claims: Counter::default(),
            collected_nodes: Counter::default(),
            cost_ratio: Gauge::default(),
            effects_in_flight: Gauge::default(),
            effects_running: Gauge::default(),
            budgets: budgets::BudgetGauges::default(),
        };
        {
            let mut r = m.lock();
            let build: Family<Labels, Gauge> = Family::default();
            build.get_or_create(&vec![("version", env!("CARGO_PKG_VERSION").to_string())]).set(1);
            r.register(
                "karpenter_build_info",
                "A metric with a constant 1 value labeled by the version it was built from",
                build,
            );
            r.register(
                "karpenter_nodeclaims_created",
                "Number of nodeclaims created in total, by the reason they were created (provisioned, or the disruption or interruption that replaced a node), the nodepool and whether minValues was relaxed",
                m.nodeclaims_created.clone(),
            );
            r.register(
                "karpenter_nodeclaims_terminated",
                "Number of nodeclaims terminated in total (their instance gone and finalizer removed), by nodepool and capacity type",
                m.nodeclaims_terminated.clone(),
            );
            r.register(
                "karpenter_nodeclaims_disrupted",
                "Number of nodeclaims disrupted in total, by reason (underutilized, empty, drifted, expired, and the interruption kinds), nodepool and capacity type",
                m.nodeclaims_disrupted.clone(),
            );
            r.register(
                "karpenter_nodes_created",
                "Number of nodes of dovetail's nodepools that joined the cluster, by nodepool",
                m.nodes_created.clone(),
            );
            r.register(
                "karpenter_nodes_terminated",
                "Number of nodes of dovetail's nodepools that left the cluster, by nodepool",
                m.nodes_terminated.clone(),
            );
            r.register(
                "karpenter_voluntary_disruption_decisions",
                "Number of disruption decisions committed, by decision (delete or replace), reason and consolidation type",
                m.disruption_decisions.clone(),
            );
            r.register(
                "karpenter_scheduler_scheduling_duration_seconds",
                "Duration of a scheduling simulation (the Router's solve of a batch of pending pods), by controller",
                m.scheduling_duration.clone(),
            );
            r.register(
                "karpenter_provisioner_scheduling_duration_seconds",
                "Duration of a scheduling simulation (the series' name before Karpenter v1; the same observations as karpenter_scheduler_scheduling_duration_seconds)",
                m.provisioner_scheduling_duration.clone(),
            );
            r.register(
                "karpenter_cloudprovider_duration_seconds",
                "Duration of cloud provider method calls, by controller, method and provider",
                m.cloud_duration.clone(),
            );
            r.register(
                "karpenter_cloudprovider_errors",
                "Number of errors returned by cloud provider method calls, by controller, method, provider and error",
                m.cloud_errors.clone(),
            );
            r.register(
                "karpenter_cloudprovider_instance_launch_failures",
                "Number of instance launches that failed, by zone, capacity type and reason",
                m.launch_failures.clone(),
            );
            r.register(
                "karpenter_interruption_received_messages",
                "Number of interruption messages received, by message type (malformed for bodies that did not parse)",
                m.interruption_received.clone(),
            );
            r.register(
                "karpenter_interruption_deleted_messages",
                "Number of interruption messages deleted from the queue",
                m.interruption_deleted.clone(),
            );
            r.register(
                "dovetail_interruption_unmatched_notices",
                "Interruption notices for instances no NodeClaim of this cluster knows (another cluster's, in an account-wide queue): deleted, never recorded",
                m.interruption_unmatched.clone(),
            );
            r.register(
                "karpenter_interruption_message_queue_duration_seconds",
                "Time an interruption message spent in its queue: from its sending to its receipt",
                m.interruption_queue_duration.clone(),
            );
            r.register(
                "dovetail_ledger_proposals",
                "Proposals to the ledger, by command and outcome (committed, not_leader, unavailable)",
                m.proposals.clone(),
            );
            r.register(
                "dovetail_ledger_proposal_duration_seconds",
                "Time from proposing an entry to its being committed and applied, by command",
                m.proposal_duration.clone(),
            );
            r.register(
                "dovetail_ledger_commit_index",
                "The highest log index of an entry this control node proposed and saw committed",
                m.commit_index.clone(),
            );
            r.register(
                "dovetail_garbage_collected_instances",
                "Instances tagged for the cluster that no NodeClaim knew, terminated by garbage collection",
                m.collected.clone(),
            );
            r.register(
                "dovetail_fleet_cost_ratio",
                "R: what the live fleet costs per hour over the lower bound of what its pods need (1 is the bound; 0 until the first reading)",
                m.cost_ratio.clone(),
            );
            r.register(
                "dovetail_executor_effects_in_flight",
                "Cluster effects the executor holds: waiting for a permit or under way",
                m.effects_in_flight.clone(),
            );
            r.register(
                "dovetail_executor_effects_running",
                "Cluster effects under way (holding one of the executor's permits)",
                m.effects_running.clone(),
            );
            r.register(
                "dovetail_garbage_collected_nodeclaims",
                "NodeClaims whose instance was gone from the cloud, ended by garbage collection",
                m.collected_claims.clone(),
            );
            r.register(
                "dovetail_garbage_collected_nodes",
                "Nodes of instances garbage collection terminated, deleted with them",
                m.collected_nodes.clone(),
            );
            r.register(
                "dovetail_ledger_failovers",
                "Times the ledger's leader changed as this control node saw it (a new term with a leader)",
                m.failovers.clone(),
            );
            m.budgets.register(&mut r);
        }
        m
    }
}
