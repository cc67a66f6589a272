//! Instance profiles managed for an EC2NodeClass's `spec.role`, as Karpenter manages them:
//! one per node class, named `<cluster>_<hash of the region and the class's name>` (the shape
//! of Karpenter's names; not the same names), under the IAM path `/dovetail/<region>/<cluster>/`,
//! tagged as the cluster's, with the role attached (another role found on it is replaced). A
//! class that names `spec.instanceProfile` uses that one as it is.

use aws_sdk_iam::Client as IamClient;
use aws_sdk_iam::error::ProvideErrorMetadata;
use aws_sdk_iam::types::Tag;

use super::errors::from_sdk;
use crate::{CloudError, TAG_CLUSTER_PREFIX};

/// The managed profile's name for a node class: stable across restarts and control nodes.
pub fn profile_name(cluster: &str, region: &str, node_class: &str) -> String {
    // FNV-1 64 of the region and the class name.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in region.bytes().chain(node_class.bytes()) {
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        h ^= u64::from(b);
    }
    format!("{cluster}_{h}")
}

/// The IAM path the cluster's managed profiles live under (how they are found again to be
/// deleted).
pub fn profile_path(cluster: &str, region: &str) -> String {
    format!("/dovetail/{region}/{cluster}/")
}

/// The role's name in `spec.role`: a name, or the last part of its ARN.
pub fn role_name(role: &str) -> &str {
    role.rsplit('/').next().unwrap_or(role)
}

/// The profile for `node_class` with `role` attached, made or mended as needed; its name.
pub async fn ensure(
    iam: &IamClient,
    (cluster, region): (&str, &str),
    node_class: &str,
    role: &str,
) -> Result<String, CloudError> {
    let name = profile_name(cluster, region, node_class);
    let role = role_name(role);
    let not_ready = |reason: String| CloudError::NodeClassNotReady { node_class: node_class.to_string(), reason };
    let mut created = false;
    let roles: Vec<String> = match roles_of(iam, &name).await {
        Ok(Some(roles)) => roles,
        Ok(None) => {
            created = true;
            let tag = |k: &str, v: &str| Tag::builder().key(k).value(v).build();
            let tags = [
                tag(&format!("{TAG_CLUSTER_PREFIX}{cluster}"), "owned"),
                tag(super::TAG_NODECLASS, node_class),
                tag("topology.kubernetes.io/region", region),
                tag("karpenter.sh/managed-by", cluster),
            ];
            let mut create =
                iam.create_instance_profile().instance_profile_name(&name).path(profile_path(cluster, region));
            for t in tags {
                match t {
                    Ok(t) => create = create.tags(t),
                    Err(e) => {
                        return Err(CloudError::Invalid {
                            what: format!("instance profile {name} tag"),
                            reason: e.to_string(),
                        });
                    }
                }
            }
            match create.send().await {
                Ok(_) => {
                    tracing::info!(instance_profile = %name, ec2nodeclass = %node_class, "instance profile {name} created");
                }
                // Another control node made it meanwhile: it is mended below like any other.
                Err(e) if e.code() == Some("EntityAlreadyExists") => {}
                Err(e) => return Err(from_sdk("CreateInstanceProfile", e)),
            }
            Vec::new()
        }
        Err(e) => return Err(e),
    };
    // IAM role names are case-insensitive.
    if roles.iter().any(|r| r.eq_ignore_ascii_case(role)) {
        return Ok(name);
    }
    for other in &roles {
        iam.remove_role_from_instance_profile()
            .instance_profile_name(&name)
            .role_name(other)
            .send()
            .await
            .map_err(|e| from_sdk("RemoveRoleFromInstanceProfile", e))?;
    }
    match iam.add_role_to_instance_profile().instance_profile_name(&name).role_name(role).send().await {
        Ok(_) => {
            tracing::info!(instance_profile = %name, role, "role {role} attached to instance profile {name}");
            Ok(name)
        }
        // Just made, the profile itself may not be visible yet (IAM is eventually consistent).
        Err(e)
            if e.code() == Some("NoSuchEntity")
                && created
                && e.message().is_some_and(|m| m.to_ascii_lowercase().contains("instance profile")) =>
        {
            Err(CloudError::Transient {
                message: format!("AddRoleToInstanceProfile: instance profile {name} not visible yet"),
            })
        }
        Err(e) if e.code() == Some("NoSuchEntity") => {
            Err(not_ready(format!("spec.role: IAM role {role:?} not found (its instance profile {name} has no role)")))
        }
        // A role is on it already: attached meanwhile by another control node, or the old
        // one still shows. Taken only once it is read back as ours.
        Err(e) if e.code() == Some("LimitExceeded") => match roles_of(iam, &name).await? {
            Some(roles) if roles.iter().any(|r| r.eq_ignore_ascii_case(role)) => Ok(name),
            _ => Err(CloudError::Transient {
                message: format!("AddRoleToInstanceProfile: instance profile {name} still has another role"),
            }),
        },
        Err(e) => Err(from_sdk("AddRoleToInstanceProfile", e)),
    }
}

/// The roles on a profile, `None` when it does not exist.
pub(crate) async fn roles_of(iam: &IamClient, name: &str) -> Result<Option<Vec<String>>, CloudError> {
    match iam.get_instance_profile().instance_profile_name(name).send().await {
        Ok(out) => Ok(Some(
            out.instance_profile()
                .map(|p| p.roles().iter().map(|r| r.role_name().to_string()).collect())
                .unwrap_or_default(),
        )),
        Err(e) if e.code() == Some("NoSuchEntity") => Ok(None),
        Err(e) => Err(from_sdk("GetInstanceProfile", e)),
    }
}

/// Deletes the cluster's managed profiles whose node class is not in `keep` (deleted, and no
/// NodeClaim uses it any more), their roles taken off first; the names deleted.
pub async fn collect(
    iam: &IamClient,
    (cluster, region): (&str, &str),
    keep: &std::collections::BTreeSet<String>,
    current: &(dyn Fn() -> bool + Send + Sync),
) -> Result<Vec<String>, CloudError> {
    let wanted: std::collections::BTreeSet<String> = keep.iter().map(|c| profile_name(cluster, region, c)).collect();
    let path = profile_path(cluster, region);
    let mut stale: Vec<(String, Vec<String>)> = Vec::new();
    let mut marker: Option<String> = None;
    // Bounded: 1,000 pages of up to 100 profiles.
    for _ in 0..1_000 {
        let out = iam
            .list_instance_profiles()
            .path_prefix(&path)
            .set_marker(marker.take())
            .send()
            .await
            .map_err(|e| from_sdk("ListInstanceProfiles", e))?;
        // Only the cluster's own path, whatever the answer holds (moto's list ignores the
        // prefix and answers every account's profile: another cluster's would have gone).
        for p in out.instance_profiles().iter().filter(|p| p.path() == path) {
            if !wanted.contains(p.instance_profile_name()) {
                let roles = p.roles().iter().map(|r| r.role_name().to_string()).collect();
                stale.push((p.instance_profile_name().to_string(), roles));
            }
        }
        match out.marker() {
            Some(m) if out.is_truncated() => marker = Some(m.to_string()),
            _ => break,
        }
    }
    let mut deleted = Vec::new();
    for (name, roles) in stale {
        // Fenced: a deposed leader deletes nothing more.
        if !current() {
            return Err(CloudError::Transient { message: "the term ended while collecting".into() });
        }
        for role in &roles {
            match iam.remove_role_from_instance_profile().instance_profile_name(&name).role_name(role).send().await {
                Ok(_) => {}
                Err(e) if e.code() == Some("NoSuchEntity") => {}
                Err(e) => return Err(from_sdk("RemoveRoleFromInstanceProfile", e)),
            }
        }
        match iam.delete_instance_profile().instance_profile_name(&name).send().await {
            Ok(_) => {
                tracing::info!(instance_profile = %name, "instance profile {name} deleted: its EC2NodeClass is gone");
                deleted.push(name);
            }
            Err(e) if e.code() == Some("NoSuchEntity") => {}
            Err(e) => return Err(from_sdk("DeleteInstanceProfile", e)),
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_name_is_the_clusters_and_stable_per_region_and_class() {
        let a = profile_name("demo", "us-east-1", "default");
        assert!(a.starts_with("demo_"), "{a}");
        assert_eq!(a, profile_name("demo", "us-east-1", "default"));
        assert_ne!(a, profile_name("demo", "us-west-2", "default"));
        assert_ne!(a, profile_name("demo", "us-east-1", "gpu"));
        assert_eq!(profile_path("demo", "us-east-1"), "/dovetail/us-east-1/demo/");
    }

    #[test]
    fn a_role_is_named_or_given_by_arn() {
        assert_eq!(role_name("KarpenterNodeRole-demo"), "KarpenterNodeRole-demo");
        assert_eq!(role_name("arn:aws:iam::123456789012:role/nodes/KarpenterNodeRole-demo"), "KarpenterNodeRole-demo");
    }
}
