//! The cloud seam of dovetail.
//!
//! [`CloudProvider`] is what the control plane asks of a cloud: launch a NodeClaim in one zone,
//! terminate, get and list instances, the instance types of a node class, drift. It speaks
//! domain types only and fails with the closed [`CloudError`] callers branch on.
//! [`InterruptionQueue`] is where interruption events (EventBridge-shaped JSON) arrive.
//!
//! Implementations: [`sim::SimCloud`] (deterministic, in memory, on the same catalog as
//! `dovetail-core`) and, in `aws`, the provider on aws-sdk-ec2/aws-sdk-sqs. Both pass the
//! same conformance suite (`tests/conformance.rs`).

pub mod aws;
pub mod batch;
pub mod events;
pub mod limits;
pub mod sim;
mod types;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub use types::{
    DriftReason, Instance, InstanceState, LaunchBatch, LaunchRequest, Lookup, NodeClass, OfferingKey, QueueMessage,
    TAG_CLUSTER_PREFIX, TAG_LAUNCH_BATCH, TAG_NODECLAIM, TAG_NODEPOOL, same_shape,
};

/// A boxed future, so that the seams stay object safe (`Arc<dyn CloudProvider>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a cloud call can fail with. Callers branch on the variant; the message is for people.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CloudError {
    /// No capacity for any of the offerings tried (each is marked unavailable by the caller).
    #[error("insufficient capacity for {}", offerings_list(.offerings))]
    InsufficientCapacity { offerings: Vec<OfferingKey> },
    /// The instance does not exist (any more).
    #[error("instance {id} not found")]
    NotFound { id: String },
    /// The node class cannot launch yet (subnets, security groups or AMIs unresolved).
    #[error("node class {node_class} is not ready: {reason}")]
    NodeClassNotReady { node_class: String, reason: String },
    /// The cloud's request rate limit was hit; retry after the given time.
    #[error("{action} throttled, retry after {retry_after:?}")]
    Throttled { action: String, retry_after: Duration },
    /// The user's configuration is wrong (an unknown AMI alias, a bad tag); retrying will not help.
    #[error("invalid {what}: {reason}")]
    Invalid { what: String, reason: String },
    /// Anything else that may succeed when retried (network, 5xx).
    #[error("transient cloud error: {message}")]
    Transient { message: String },
}

impl CloudError {
    /// A short name of the error, for counters.
    pub fn kind(&self) -> &'static str {
        match self {
            CloudError::InsufficientCapacity { .. } => "insufficient_capacity",
            CloudError::NotFound { .. } => "not_found",
            CloudError::NodeClassNotReady { .. } => "node_class_not_ready",
            CloudError::Throttled { .. } => "throttled",
            CloudError::Invalid { .. } => "invalid",
            CloudError::Transient { .. } => "transient",
        }
    }
}

fn offerings_list(o: &[OfferingKey]) -> String {
    let shown: Vec<String> = o.iter().take(5).map(ToString::to_string).collect();
    let more = if o.len() > 5 { format!(" and {} more", o.len() - 5) } else { String::new() };
    format!("{}{more}", shown.join(", "))
}

/// The compute side of a cloud.
///
/// Contracts every implementation keeps (the conformance suite checks them):
/// - `launch` takes NodeClaims for one zone each and returns one result per request, in order.
///   Launching a claim that already has an instance returns that instance again (idempotent:
///   instances carry the claim's name in the [`TAG_NODECLAIM`] tag). Every instance a call makes
///   carries its launch batch in the [`TAG_LAUNCH_BATCH`] tag from the moment it exists; before
///   launching anything, the batch's instances that no claim tag names yet (a call whose
///   per-claim tags were never written: a crash, a lost result) are assigned to the batch's
///   claims that have none, in the batch's claim order and by instance id, so any re-drive,
///   however it groups the claims, ends with one instance per claim. Identical requests of one
///   call may be merged into one cloud request. A launch that finds no capacity in any of the
///   claim's offerings fails with [`CloudError::InsufficientCapacity`] naming them.
/// - `find` looks up claims' instances the same way and launches nothing (the instance of a
///   claim deleted while it launched).
/// - `terminate` returns one result per id; an id that is gone gives [`CloudError::NotFound`], so a
///   retried terminate is harmless.
/// - `get` returns [`CloudError::NotFound`] once an instance is terminated.
/// - `list` returns every live instance tagged for this cluster, whether or not a claim knows it
///   (garbage collection finds leaks there).
/// - `instance_types` returns every type the node class can use, with every offering (available or
///   not) and its price.
/// - Rate limits surface as [`CloudError::Throttled`] with a retry-after; nothing is retried inside.
pub trait CloudProvider: Send + Sync {
    /// The provider's name, as metrics label it (`aws`, `sim`).
    fn name(&self) -> &'static str {
        "unknown"
    }

    /// Launches NodeClaims, each in the zone it names.
    fn launch<'a>(&'a self, requests: &'a [LaunchRequest]) -> BoxFuture<'a, Vec<Result<Instance, CloudError>>>;

    /// The instance of each claim, if it has one (by its tag, or assigned from its batch's
    /// untagged instances as `launch` assigns them).
    fn find<'a>(&'a self, lookups: &'a [Lookup]) -> BoxFuture<'a, Vec<Result<Option<Instance>, CloudError>>>;

    /// Terminates instances by id.
    fn terminate<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Vec<Result<(), CloudError>>>;

    /// One instance by id.
    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Instance, CloudError>>;

    /// Every live instance tagged for this cluster.
    fn list(&self) -> BoxFuture<'_, Result<Vec<Instance>, CloudError>>;

    /// The instance types a node class can launch, with offerings and prices.
    fn instance_types<'a>(
        &'a self,
        node_class: &'a NodeClass,
    ) -> BoxFuture<'a, Result<Vec<dovetail_core::catalog::InstanceType>, CloudError>>;

    /// Why an instance no longer matches its node class, if it does not.
    fn is_drifted<'a>(
        &'a self,
        instance: &'a Instance,
        node_class: &'a NodeClass,
    ) -> BoxFuture<'a, Result<Option<DriftReason>, CloudError>>;
}

/// Where interruption events arrive (SQS, or the sim cloud's queue).
///
/// Contracts: `receive` returns at most `max` (at most 10) visible messages and hides each for
/// the queue's visibility timeout; a message not deleted becomes visible again after it
/// (at-least-once). `delete` is idempotent. `change_visibility` hides a received message for
/// another `timeout` (zero makes it visible now).
pub trait InterruptionQueue: Send + Sync {
    /// Up to `max` messages (long polling up to `wait` where the queue supports it).
    fn receive(&self, max: usize, wait: Duration) -> BoxFuture<'_, Result<Vec<QueueMessage>, CloudError>>;

    /// Deletes received messages by receipt handle.
    fn delete<'a>(&'a self, receipts: &'a [String]) -> BoxFuture<'a, Result<(), CloudError>>;

    /// Hides a received message for `timeout` from now.
    fn change_visibility<'a>(&'a self, receipt: &'a str, timeout: Duration) -> BoxFuture<'a, Result<(), CloudError>>;
}
