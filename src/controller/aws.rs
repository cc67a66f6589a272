//! `--cloud aws`: the EC2 provider set up from the settings and from the cluster the
//! controller talks to (its endpoint and CA go into the nodes' user data, its version picks
//! the alias AMIs), and EC2NodeClasses as the provider reads them.

use std::collections::BTreeMap;
use std::sync::Arc;

use dovetail_api::crd;
use dovetail_cloud::NodeClass;
use dovetail_cloud::aws::{AwsConfig, AwsProvider, base64};
use dovetail_core::clock::Clock;

use super::settings::Settings;

/// How the nodes reach the cluster's API server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterAccess {
    /// `https://…`, as the kube client reaches it (or `--cluster-endpoint`).
    pub endpoint: String,
    /// The CA bundle as PEM, base64-encoded (a kubeconfig's `certificate-authority-data`);
    /// empty when the connection has none (`insecure-skip-tls-verify`).
    pub ca: String,
    /// Reached through the in-cluster Service (the controller runs in a pod): an address a
    /// new node cannot use to join.
    pub in_cluster: bool,
}

impl ClusterAccess {
    /// From the kube client's configuration: its URL, and its root certificates as PEM.
    pub fn of(config: &kube::Config, in_cluster: bool) -> Self {
        let mut pem = String::new();
        for der in config.root_cert.iter().flatten() {
            pem.push_str("-----BEGIN CERTIFICATE-----\n");
            let b64 = base64(der);
            for line in b64.as_bytes().chunks(64) {
                pem.push_str(&String::from_utf8_lossy(line));
                pem.push('\n');
            }
            pem.push_str("-----END CERTIFICATE-----\n");
        }
        let endpoint = config.cluster_url.to_string().trim_end_matches('/').to_string();
        ClusterAccess { endpoint, ca: base64(pem.as_bytes()), in_cluster }
    }
}

/// The EC2 provider for the settings: credentials from the SDK's chain (environment,
/// profile, web identity, instance metadata), the region and endpoint as set.
pub async fn provider(
    s: &Settings,
    access: &ClusterAccess,
    kubernetes_version: &str,
    clock: Arc<dyn Clock>,
) -> Result<AwsProvider, String> {
    let cluster_endpoint = match (&s.cluster_endpoint, access.in_cluster) {
        (Some(e), _) => e.clone(),
        (None, false) => access.endpoint.clone(),
        (None, true) => {
            return Err(format!(
                "--cloud aws in a pod needs --cluster-endpoint (the API server endpoint new nodes join): \
                 the in-cluster address {} is a Service a node cannot reach before it joined",
                access.endpoint
            ));
        }
    };
    let cluster_ca = s.cluster_ca_bundle.clone().unwrap_or_else(|| access.ca.clone());
    if cluster_ca.is_empty() {
        return Err("--cloud aws: the connection to the API server has no CA (insecure-skip-tls-verify?) \
                    and new nodes need one to join: set --cluster-ca-bundle"
            .into());
    }
    let mut cfg = AwsConfig {
        cluster: s.cluster_name.clone(),
        region: s.region_set.then(|| s.region.clone()),
        endpoint: s.aws_endpoint.clone(),
        cluster_endpoint,
        cluster_ca,
        kubernetes_version: kubernetes_version.to_string(),
        price_refresh: s.price_refresh,
        catalog_refresh: s.catalog_refresh,
        ..AwsConfig::default()
    };
    if let Some(prefix) = &s.ami_parameter_prefix {
        cfg.ami_parameter_prefix = prefix.clone();
    }
    AwsProvider::connect(cfg, clock).await.map_err(|e| format!("--cloud aws: {e}"))
}

/// An EC2NodeClass as the cloud seam reads it: its selector terms (each term's `id`, `name`
/// and, for AMIs, `owner` beside its tags), its alias, role or instance profile and tags. The
/// hash changes with the spec's generation (drift).
pub fn node_class(name: &str, nc: &crd::EC2NodeClass) -> NodeClass {
    let term = |tags: &Option<BTreeMap<String, String>>, fields: &[(&str, &Option<String>)]| {
        let mut t = tags.clone().unwrap_or_default();
        for (key, value) in fields {
            if let Some(v) = value {
                t.insert((*key).to_string(), v.clone());
            }
        }
        t
    };
    let spec = &nc.spec;
    let hash = nc.metadata.generation.map_or_else(|| name.to_string(), |g| format!("{name}-{g}"));
    NodeClass {
        name: name.to_string(),
        subnet_selector: spec.subnet_selector_terms.iter().map(|t| term(&t.tags, &[("id", &t.id)])).collect(),
        security_group_selector: spec
            .security_group_selector_terms
            .iter()
            .map(|t| term(&t.tags, &[("id", &t.id), ("name", &t.name)]))
            .collect(),
        ami_alias: spec.ami_selector_terms.iter().find_map(|t| t.alias.clone()),
        ami_selector: spec
            .ami_selector_terms
            .iter()
            .filter(|t| t.alias.is_none())
            .map(|t| term(&t.tags, &[("id", &t.id), ("name", &t.name), ("owner", &t.owner)]))
            .collect(),
        role: spec.role.clone(),
        instance_profile: spec.instance_profile.clone(),
        tags: spec.tags.clone().unwrap_or_default(),
        hash,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ec2nodeclass_maps_its_terms_alias_and_profile() {
        let yaml = r#"
apiVersion: karpenter.k8s.aws/v1
kind: EC2NodeClass
metadata: {name: default, generation: 3}
spec:
  instanceProfile: nodes
  amiSelectorTerms: [{alias: al2023@latest}]
  subnetSelectorTerms: [{tags: {karpenter.sh/discovery: demo}}, {id: subnet-1}]
  securityGroupSelectorTerms: [{name: eks-nodes}]
  tags: {team: a}
"#;
        let nc: crd::EC2NodeClass = serde_yaml::from_str(yaml).expect("parses");
        let c = node_class("default", &nc);
        assert_eq!(c.ami_alias.as_deref(), Some("al2023@latest"));
        assert!(c.ami_selector.is_empty());
        assert_eq!(c.subnet_selector.len(), 2);
        assert_eq!(c.subnet_selector[0].get("karpenter.sh/discovery").map(String::as_str), Some("demo"));
        assert_eq!(c.subnet_selector[1].get("id").map(String::as_str), Some("subnet-1"));
        assert_eq!(c.security_group_selector[0].get("name").map(String::as_str), Some("eks-nodes"));
        assert_eq!(c.instance_profile.as_deref(), Some("nodes"));
        assert_eq!(c.tags.get("team").map(String::as_str), Some("a"));
        assert_eq!(c.hash, "default-3");
    }
}
