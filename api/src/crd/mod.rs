//! The Kubernetes custom resources dovetail serves: Karpenter's `NodePool` and `NodeClaim`
//! (`karpenter.sh/v1`) and the AWS provider's `EC2NodeClass` (`karpenter.k8s.aws/v1`).

pub mod common;
pub mod ec2nodeclass;
pub mod nodeclaim;
pub mod nodepool;

pub use common::{NodeClassReference, NodeSelectorRequirementWithMinValues};
pub use ec2nodeclass::{EC2NodeClass, EC2NodeClassSpec, KubeletConfiguration};
pub use nodeclaim::{NodeClaim, NodeClaimSpec};
pub use nodepool::{NodePool, NodePoolSpec};
