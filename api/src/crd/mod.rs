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

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    use super::*;

    #[test]
    fn crds_have_karpenter_names_and_versions() {
        let np = NodePool::crd();
        assert_eq!(np.metadata.name.as_deref(), Some("nodepools.karpenter.sh"));
        assert_eq!(np.spec.versions[0].name, "v1");
        assert_eq!(NodeClaim::crd().metadata.name.as_deref(), Some("nodeclaims.karpenter.sh"));
        assert_eq!(EC2NodeClass::crd().metadata.name.as_deref(), Some("ec2nodeclasses.karpenter.k8s.aws"));
        assert_eq!(np.spec.scope, "Cluster");
    }
}
