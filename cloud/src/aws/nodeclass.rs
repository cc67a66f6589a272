//! EC2NodeClass resolution: subnets and security groups by selector terms, the AMI by alias
//! (the EKS-optimized AMI's public SSM parameter, as Karpenter reads it) or by selector terms,
//! and a launch template per (AMI, security groups, user data).

use std::collections::BTreeMap;

use aws_sdk_ec2::Client;
use aws_sdk_ec2::types::{
    Filter, LaunchTemplateHttpTokensState, LaunchTemplateIamInstanceProfileSpecificationRequest,
    LaunchTemplateInstanceMetadataEndpointState, LaunchTemplateInstanceMetadataOptionsRequest,
    RequestLaunchTemplateData, ResourceType, Tag, TagSpecification,
};
use aws_sdk_ssm::Client as SsmClient;

use super::errors::from_sdk;
use crate::{CloudError, NodeClass, TAG_CLUSTER_PREFIX};

/// What a node class resolves to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Resolved {
    /// (subnet id, zone).
    pub subnets: Vec<(String, String)>,
    pub security_groups: Vec<String>,
    /// (AMI id, architecture `amd64`/`arm64`).
    pub images: Vec<(String, String)>,
    /// The instance profile the nodes get: `spec.instanceProfile`, or the one managed for
    /// `spec.role`.
    pub instance_profile: Option<String>,
    /// What the status shows beside the ids.
    pub names: Names,
}

/// Names and zone ids of what a node class resolved to, for its status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Names {
    /// Subnet id -> availability zone id.
    pub zone_ids: BTreeMap<String, String>,
    /// Security group id -> name.
    pub groups: BTreeMap<String, String>,
    /// AMI id -> name.
    pub images: BTreeMap<String, String>,
}

/// A part of a node class that did not resolve: the status condition it makes false
/// (Karpenter's `SubnetsReady`, `SecurityGroupsReady`, `AMIsReady`, `InstanceProfileReady`),
/// Karpenter's reason, and what was looked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unmet {
    pub condition: &'static str,
    pub reason: &'static str,
    pub message: String,
}

impl Unmet {
    /// The error a launch on the node class gets.
    pub fn error(&self, node_class: &str) -> CloudError {
        CloudError::NodeClassNotReady { node_class: node_class.to_string(), reason: self.message.clone() }
    }
}

/// EC2 filters for one selector term: `id` selects by id, `name` by name (security groups'
/// `group-name`), other keys by tag (`*` = any value).
fn filters(term: &BTreeMap<String, String>, id_filter: &str) -> Vec<Filter> {
    term.iter()
        .map(|(k, v)| {
            if k == "id" {
                Filter::builder().name(id_filter).values(v).build()
            } else if k == "name" && id_filter == "group-id" {
                Filter::builder().name("group-name").values(v).build()
            } else if v == "*" {
                Filter::builder().name("tag-key").values(k).build()
            } else {
                Filter::builder().name(format!("tag:{k}")).values(v).build()
            }
        })
        .collect()
}

/// Resolves subnets, security groups and images; the first part found empty is
/// `NodeClassNotReady`, an unknown alias `Invalid`.
pub async fn resolve(
    ec2: &Client,
    ssm: &SsmClient,
    amis: &AmiParameters,
    nc: &NodeClass,
) -> Result<Resolved, CloudError> {
    let (resolved, unmet) = resolve_parts(ec2, ssm, amis, nc).await?;
    match unmet.first() {
        Some(u) => Err(u.error(&nc.name)),
        None => Ok(resolved),
    }
}

/// Resolves each part of the node class on its own (as Karpenter's EC2NodeClass controller
/// does), so the status shows what was found and names each part that found nothing. An
/// error is a call that failed or a spec that cannot work (an unknown alias).
pub async fn resolve_parts(
    ec2: &Client,
    ssm: &SsmClient,
    amis: &AmiParameters,
    nc: &NodeClass,
) -> Result<(Resolved, Vec<Unmet>), CloudError> {
    let mut r = Resolved { instance_profile: nc.instance_profile.clone(), ..Resolved::default() };
    let mut unmet = Vec::new();
    for term in &nc.subnet_selector {
        let out = ec2
            .describe_subnets()
            .set_filters(Some(filters(term, "subnet-id")))
            .send()
            .await
            .map_err(|e| from_sdk("DescribeSubnets", e))?;
        for s in out.subnets() {
            if let (Some(id), Some(zone)) = (s.subnet_id(), s.availability_zone())
                && !r.subnets.iter().any(|(i, _)| i == id)
            {
                r.subnets.push((id.to_string(), zone.to_string()));
                if let Some(zone_id) = s.availability_zone_id() {
                    r.names.zone_ids.insert(id.to_string(), zone_id.to_string());
                }
            }
        }
    }
    r.subnets.sort();
    if r.subnets.is_empty() {
        unmet.push(Unmet {
            condition: "SubnetsReady",
            reason: "SubnetsNotFound",
            message: format!("no subnet matches subnetSelectorTerms {:?}", nc.subnet_selector),
        });
    }
    for term in &nc.security_group_selector {
        let out = ec2
            .describe_security_groups()
            .set_filters(Some(filters(term, "group-id")))
            .send()
            .await
            .map_err(|e| from_sdk("DescribeSecurityGroups", e))?;
        for g in out.security_groups() {
            if let Some(id) = g.group_id()
                && !r.security_groups.iter().any(|i| i == id)
            {
                r.security_groups.push(id.to_string());
                if let Some(name) = g.group_name() {
                    r.names.groups.insert(id.to_string(), name.to_string());
                }
            }
        }
    }
    r.security_groups.sort();
    if r.security_groups.is_empty() {
        unmet.push(Unmet {
            condition: "SecurityGroupsReady",
            reason: "SecurityGroupsNotFound",
            message: format!("no security group matches securityGroupSelectorTerms {:?}", nc.security_group_selector),
        });
    }
    match images(ec2, ssm, amis, nc).await? {
        Ok(found) => {
            for (id, arch, name) in found {
                if let Some(name) = name {
                    r.names.images.insert(id.clone(), name);
                }
                r.images.push((id, arch));
            }
        }
        Err(message) => unmet.push(Unmet { condition: "AMIsReady", reason: "AMINotFound", message }),
    }
    Ok((r, unmet))
}

/// Where alias AMIs are looked up: the public SSM parameters of the EKS-optimized AMIs.
#[derive(Clone, Debug, PartialEq)]
pub struct AmiParameters {
    /// The cluster's Kubernetes minor version (`1.33`).
    pub kubernetes_version: String,
    /// Parameter path prefix, `/aws/service/eks/optimized-ami` (a private copy elsewhere works).
    pub prefix: String,
}

/// The SSM parameter of an alias's image for an architecture (`x86_64`/`arm64`), as Karpenter
/// reads it (standard variant).
pub fn alias_parameter(p: &AmiParameters, family: &str, version: &str, arch: &str) -> Option<String> {
    let k8s = &p.kubernetes_version;
    let prefix = p.prefix.trim_end_matches('/');
    match family {
        "al2023" => {
            let name = if version == "latest" {
                "recommended".to_string()
            } else {
                format!("amazon-eks-node-al2023-{arch}-standard-{k8s}-{version}")
            };
            Some(format!("{prefix}/{k8s}/amazon-linux-2023/{arch}/standard/{name}/image_id"))
        }
        "al2" => {
            let (dir, node) = if arch == "arm64" {
                ("amazon-linux-2-arm64", "amazon-eks-arm64-node")
            } else {
                ("amazon-linux-2", "amazon-eks-node")
            };
            let name = if version == "latest" { "recommended".to_string() } else { format!("{node}-{k8s}-{version}") };
            Some(format!("{prefix}/{k8s}/{dir}/{name}/image_id"))
        }
        _ => None,
    }
}

/// An AMI found: (id, architecture `amd64`/`arm64`, name when EC2 knows it).
type Image = (String, String, Option<String>);

/// The AMIs of the node class: for an alias, the image each architecture's public SSM
/// parameter names (their names read from EC2); else every image the selector terms match.
/// `Ok(Err(why))` when none is found.
async fn images(
    ec2: &Client,
    ssm: &SsmClient,
    amis: &AmiParameters,
    nc: &NodeClass,
) -> Result<Result<Vec<Image>, String>, CloudError> {
    let mut out: Vec<Image> = Vec::new();
    if let Some(alias) = &nc.ami_alias {
        let invalid = |reason: String| CloudError::Invalid {
            what: format!("EC2NodeClass {} spec.amiSelectorTerms[].alias {alias:?}", nc.name),
            reason,
        };
        let (family, version) = alias.split_once('@').unwrap_or((alias.as_str(), "latest"));
        match family {
            "al2023" | "al2" => {}
            "bottlerocket" | "windows2019" | "windows2022" | "windows2025" => {
                return Err(invalid(format!("AMI family {family:?} is not supported yet (supported: al2023, al2)")));
            }
            _ => return Err(invalid(format!("unknown AMI family {family:?} (supported: al2023, al2)"))),
        }
        let pinned = version.len() == 9 && version.starts_with('v') && version[1..].bytes().all(|b| b.is_ascii_digit());
        if version != "latest" && !pinned {
            return Err(invalid(format!("version {version:?} is neither \"latest\" nor vYYYYMMDD")));
        }
        for (arch, label) in [("x86_64", "amd64"), ("arm64", "arm64")] {
            let Some(path) = alias_parameter(amis, family, version, arch) else { continue };
            match ssm.get_parameter().name(&path).send().await {
                Ok(p) => {
                    if let Some(id) = p.parameter().and_then(|p| p.value()) {
                        out.push((id.to_string(), label.to_string(), None));
                    }
                }
                Err(e) if aws_sdk_ssm::error::ProvideErrorMetadata::code(&e) == Some("ParameterNotFound") => {}
                Err(e) => {
                    let message = aws_sdk_ssm::error::ProvideErrorMetadata::message(&e)
                        .map(str::to_string)
                        .unwrap_or_else(|| format!("{e:?}"));
                    return Err(super::errors::from_code(
                        "GetParameter",
                        aws_sdk_ssm::error::ProvideErrorMetadata::code(&e),
                        &message,
                    ));
                }
            }
        }
        if out.is_empty() {
            return Ok(Err(format!(
                "no AMI for alias {alias} on Kubernetes {} (SSM parameters under {})",
                amis.kubernetes_version, amis.prefix
            )));
        }
        let ids: Vec<String> = out.iter().map(|(id, ..)| id.clone()).collect();
        // By filter, not by id: an id EC2 does not know is then no error (the launch says so).
        let named = ec2
            .describe_images()
            .filters(Filter::builder().name("image-id").set_values(Some(ids)).build())
            .send()
            .await
            .map_err(|e| from_sdk("DescribeImages", e))?;
        for i in named.images() {
            if let Some(found) = out.iter_mut().find(|(id, ..)| Some(id.as_str()) == i.image_id()) {
                found.2 = i.name().map(str::to_string);
            }
        }
        return Ok(Ok(out));
    }
    for term in &nc.ami_selector {
        let mut f = Vec::new();
        for (k, v) in term {
            match k.as_str() {
                "id" => f.push(Filter::builder().name("image-id").values(v).build()),
                "name" => f.push(Filter::builder().name("name").values(v).build()),
                "owner" => {}
                _ => f.push(Filter::builder().name(format!("tag:{k}")).values(v).build()),
            }
        }
        let found = ec2
            .describe_images()
            .set_filters(Some(f))
            .set_owners(ami_owners(term))
            .send()
            .await
            .map_err(|e| from_sdk("DescribeImages", e))?;
        for i in found.images() {
            let arch = match i.architecture().map(|a| a.as_str()) {
                Some("arm64") => "arm64",
                _ => "amd64",
            };
            if let Some(id) = i.image_id()
                && !out.iter().any(|(known, ..)| known == id)
            {
                out.push((id.to_string(), arch.to_string(), i.name().map(str::to_string)));
            }
        }
    }
    if out.is_empty() {
        return Ok(Err(format!("no AMI matches amiSelectorTerms {:?}", nc.ami_selector)));
    }
    Ok(Ok(out))
}

/// The owners an AMI term searches, as Karpenter: its `owner` (an account id, or `self`,
/// `amazon`, ...); a term by `name` without one searches only the account's own and Amazon's
/// images, never every public image of that name.
fn ami_owners(term: &BTreeMap<String, String>) -> Option<Vec<String>> {
    match (term.get("owner"), term.contains_key("name")) {
        (Some(owner), _) => Some(vec![owner.clone()]),
        (None, true) => Some(vec!["self".to_string(), "amazon".to_string()]),
        (None, false) => None,
    }
}

/// AL2023 nodeadm user data (a MIME multi-part document with a `NodeConfig`).
pub fn user_data(cluster: &str, endpoint: &str, ca: &str, labels: &BTreeMap<String, String>) -> String {
    let node_labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!(
        "MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"//\"\r\n\r\n--//\r\nContent-Type: application/node.eks.aws\r\n\r\n\
         apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  cluster:\n    name: {cluster}\n    apiServerEndpoint: {endpoint}\n    certificateAuthority: {ca}\n  kubelet:\n    flags:\n    - --node-labels={}\n\r\n--//--\r\n",
        node_labels.join(",")
    )
}

/// What a launch template holds.
pub struct TemplateSpec<'a> {
    pub image: &'a str,
    pub security_groups: &'a [String],
    pub user_data: &'a str,
    pub instance_profile: Option<&'a str>,
}

impl TemplateSpec<'_> {
    /// A hash of the content: the template's name, so equal content reuses one template.
    pub fn hash(&self) -> u64 {
        let mut h = super::Fnv::default();
        let groups = self.security_groups.join(",");
        for part in [self.image, &groups, self.user_data, self.instance_profile.unwrap_or_default()] {
            h.write(part.as_bytes());
            h.write(&[0]);
        }
        h.finish()
    }
}

/// Creates (once) the launch template for an image, security groups, user data and instance
/// profile, tagged for the cluster; returns its name. The name is derived from the content, so
/// an existing one is reused.
pub async fn launch_template(ec2: &Client, cluster: &str, spec: &TemplateSpec<'_>) -> Result<String, CloudError> {
    let name = format!("dovetail-{cluster}-{:016x}", spec.hash());
    let mut data = RequestLaunchTemplateData::builder()
        .image_id(spec.image)
        .set_security_group_ids(Some(spec.security_groups.to_vec()))
        .user_data(super::base64(spec.user_data.as_bytes()));
    if let Some(profile) = spec.instance_profile {
        data = data.iam_instance_profile(
            LaunchTemplateIamInstanceProfileSpecificationRequest::builder().name(profile).build(),
        );
    }
    let data = data
        .metadata_options(
            LaunchTemplateInstanceMetadataOptionsRequest::builder()
                .http_endpoint(LaunchTemplateInstanceMetadataEndpointState::Enabled)
                .http_tokens(LaunchTemplateHttpTokensState::Required)
                .http_put_response_hop_limit(1)
                .build(),
        )
        .build();
    let owned = Tag::builder().key(format!("{TAG_CLUSTER_PREFIX}{cluster}")).value("owned").build();
    let call = ec2.create_launch_template().launch_template_name(&name).launch_template_data(data).tag_specifications(
        TagSpecification::builder().resource_type(ResourceType::LaunchTemplate).tags(owned).build(),
    );
    match call.send().await {
        Ok(_) => Ok(name),
        Err(e)
            if e.as_service_error()
                .and_then(|s| aws_sdk_ec2::error::ProvideErrorMetadata::code(s))
                .is_some_and(|c| c.contains("AlreadyExists")) =>
        {
            Ok(name)
        }
        Err(e) => Err(from_sdk("CreateLaunchTemplate", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ami_term_by_name_searches_the_accounts_and_amazons_images_unless_it_names_an_owner() {
        let term = |pairs: &[(&str, &str)]| {
            pairs.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect::<BTreeMap<_, _>>()
        };
        assert_eq!(ami_owners(&term(&[("name", "my-ami-*")])), Some(vec!["self".into(), "amazon".into()]));
        assert_eq!(ami_owners(&term(&[("name", "x"), ("owner", "123456789012")])), Some(vec!["123456789012".into()]));
        assert_eq!(ami_owners(&term(&[("owner", "self")])), Some(vec!["self".into()]));
        assert_eq!(ami_owners(&term(&[("id", "ami-1")])), None);
    }

    #[test]
    fn a_security_group_term_by_name_filters_on_the_group_name() {
        let term = BTreeMap::from([("name".to_string(), "eks-nodes".to_string())]);
        let f = filters(&term, "group-id");
        assert_eq!(f[0].name(), Some("group-name"));
        let f = filters(&term, "subnet-id");
        assert_eq!(f[0].name(), Some("tag:name"), "subnets have no name term: a tag");
    }

    #[test]
    fn alias_parameters_are_karpenters_paths() {
        let p = AmiParameters { kubernetes_version: "1.33".into(), prefix: "/aws/service/eks/optimized-ami".into() };
        assert_eq!(
            alias_parameter(&p, "al2023", "latest", "x86_64").as_deref(),
            Some("/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/x86_64/standard/recommended/image_id")
        );
        assert_eq!(
            alias_parameter(&p, "al2023", "v20250101", "arm64").as_deref(),
            Some(
                "/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/arm64/standard/amazon-eks-node-al2023-arm64-standard-1.33-v20250101/image_id"
            )
        );
        assert_eq!(
            alias_parameter(&p, "al2", "latest", "arm64").as_deref(),
            Some("/aws/service/eks/optimized-ami/1.33/amazon-linux-2-arm64/recommended/image_id")
        );
        assert_eq!(alias_parameter(&p, "ubuntu", "latest", "arm64"), None);
    }
}
