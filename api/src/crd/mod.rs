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

    /// Karpenter spells acronyms in capitals (`providerID`, `kmsKeyID`); serde's camelCase
    /// would not, and a user's YAML key would be an unknown field, dropped without a word.
    #[test]
    fn acronym_fields_keep_karpenters_json_names() -> Result<(), Box<dyn std::error::Error>> {
        let class: EC2NodeClass = serde_yaml::from_str(
            r#"
apiVersion: karpenter.k8s.aws/v1
kind: EC2NodeClass
metadata: {name: default}
spec:
  role: KarpenterNodeRole
  amiSelectorTerms: [{alias: al2023@latest}]
  associatePublicIPAddress: true
  kubelet: {clusterDNS: [10.0.0.10]}
  blockDeviceMappings:
    - deviceName: /dev/xvda
      ebs: {volumeSize: 20Gi, kmsKeyID: alias/ebs, snapshotID: snap-1}
"#,
        )?;
        assert_eq!(class.spec.associate_public_ip_address, Some(true));
        assert_eq!(
            class.spec.kubelet.as_ref().and_then(|k| k.cluster_dns.clone()),
            Some(vec!["10.0.0.10".to_string()])
        );
        let ebs = class
            .spec
            .block_device_mappings
            .as_ref()
            .and_then(|m| m.first())
            .and_then(|m| m.ebs.clone())
            .ok_or("no ebs")?;
        assert_eq!((ebs.kms_key_id.as_deref(), ebs.snapshot_id.as_deref()), (Some("alias/ebs"), Some("snap-1")));
        let out = serde_json::to_string(&class)?;
        for key in ["associatePublicIPAddress", "clusterDNS", "kmsKeyID", "snapshotID"] {
            assert!(out.contains(&format!("\"{key}\"")), "{key} in {out}");
        }
        let claim: NodeClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": {"name": "default-abcde"},
            "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}, "requirements": []},
            "status": {"providerID": "aws:///us-east-1a/i-1", "imageID": "ami-1"}
        }))?;
        let status = claim.status.ok_or("no status")?;
        assert_eq!(status.provider_id.as_deref(), Some("aws:///us-east-1a/i-1"));
        assert_eq!(status.image_id.as_deref(), Some("ami-1"));
        Ok(())
    }
}
