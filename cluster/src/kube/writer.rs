//! The [`ClusterWriter`] on the API server: every write through the token bucket, writes made
//! from a read under its resource version, NodeClaim status through the status subresource.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use dovetail_api::{convert, crd};
use dovetail_core::node::Node;
use dovetail_core::pod::PodKey;
use k8s_openapi::api::core::v1 as k8s;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{FIELD_MANAGER, KubeCluster, conversion, rfc3339, version_of};
use crate::{BoxFuture, ClusterError, ClusterWriter, Event, NodeClaim, NodeClaimStatus, NodeClaimUpdate, NodeUpdate};

impl KubeCluster {
    /// The uid of the object an Event is about, or `None` (logged) when it cannot be read:
    /// the Event is still recorded, by name.
    async fn uid_of(&self, kind: crate::ObjectKind, namespace: &str, name: &str) -> Option<String> {
        use crate::ObjectKind;
        let cached = {
            let s = self.shared.lock();
            match kind {
                ObjectKind::NodeClaim => s.claim_uids.get(name).cloned(),
                ObjectKind::NodePool => s.pool_uids.get(name).cloned(),
                ObjectKind::Pod | ObjectKind::Node => None,
            }
        };
        if cached.is_some() {
            return cached;
        }
        self.admit().await;
        let c = self.client.clone();
        let meta = match kind {
            ObjectKind::Pod => Api::<k8s::Pod>::namespaced(c, namespace).get_metadata(name).await.map(|m| m.metadata),
            ObjectKind::Node => Api::<k8s::Node>::all(c).get_metadata(name).await.map(|m| m.metadata),
            ObjectKind::NodeClaim => Api::<crd::NodeClaim>::all(c).get_metadata(name).await.map(|m| m.metadata),
            ObjectKind::NodePool => Api::<crd::NodePool>::all(c).get_metadata(name).await.map(|m| m.metadata),
        };
        match meta {
            Ok(m) => m.uid,
            Err(e) => {
                tracing::debug!(object = %name, error = %e, "reading the uid of {name} for its event failed; recording it by name");
                None
            }
        }
    }

    /// The node's ownerReferences with NodeClaim `claim` (uid `uid`) added, read from the
    /// server (once, at registration) so that owners others set are kept. The node must still
    /// be at `resource_version`, the version its patch is based on, else `Conflict`.
    async fn owners_with(
        &self,
        name: &str,
        resource_version: u64,
        claim: &str,
        uid: &str,
    ) -> Result<serde_json::Value, ClusterError> {
        self.admit().await;
        let api: Api<k8s::Node> = Api::all(self.client.clone());
        let meta = api.get_metadata(name).await.map_err(|e| self.api_error("node", name, e))?.metadata;
        if version_of(&meta) != resource_version {
            return Err(ClusterError::Conflict { kind: "node", name: name.to_string() });
        }
        let mut owners: Vec<_> =
            meta.owner_references.unwrap_or_default().into_iter().filter(|o| o.uid != uid).collect();
        owners.push(k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "karpenter.sh/v1".into(),
            kind: "NodeClaim".into(),
            name: claim.to_string(),
            uid: uid.to_string(),
            block_owner_deletion: Some(true),
            controller: None,
        });
        Ok(json!(owners))
    }
}

/// Taints as the API writes them (`value` left out when empty).
pub fn taints_json<'a>(taints: impl IntoIterator<Item = &'a dovetail_core::taints::Taint>) -> serde_json::Value {
    serde_json::Value::Array(
        taints
            .into_iter()
            .map(|t| {
                let mut o = json!({ "key": t.key, "effect": t.effect.as_str() });
                if !t.value.is_empty() {
                    o["value"] = json!(t.value);
                }
                o
            })
            .collect(),
    )
}

impl ClusterWriter for KubeCluster {
    fn ready(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.paced())
    }

    fn create_nodeclaim(&self, claim: NodeClaim) -> BoxFuture<'_, Result<u64, ClusterError>> {
        Box::pin(async move {
            // A NodeClaim is owned by its NodePool (deleting the NodePool deletes its claims).
            // A NodePool the synced cache no longer holds was deleted: a claim created for it
            // now would have no owner and outlive it, its instance launched for nobody.
            let Some(uid) = self.shared.lock().pool_uids.get(&claim.spec.nodepool).cloned() else {
                return Err(ClusterError::NotFound { kind: "nodepool", name: claim.spec.nodepool.clone() });
            };
            self.admit().await;
            let obj = convert::nodeclaim(&claim.name, &claim.spec, Some(&uid));
            let api: Api<crd::NodeClaim> = Api::all(self.client.clone());
            let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() };
            let out = api.create(&pp, &obj).await.map_err(|e| self.api_error("nodeclaim", &claim.name, e))?;
            Ok(version_of(&out.metadata))
        })
    }

    fn get_nodeclaim<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Arc<NodeClaim>, ClusterError>> {
        Box::pin(async move {
            self.admit().await;
            let api: Api<crd::NodeClaim> = Api::all(self.client.clone());
            let obj = api.get(name).await.map_err(|e| self.api_error("nodeclaim", name, e))?;
            let conditions = obj.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
            let claim = convert::nodeclaim_from_object(&obj).map_err(|e| conversion("nodeclaim", name, e))?;
            self.shared.lock().claim_conditions.insert(name.to_string(), conditions);
            Ok(Arc::new(claim))
        })
    }

    fn update_nodeclaim_status<'a>(
        &'a self,
        name: &'a str,
        status: NodeClaimStatus,
        resource_version: u64,
    ) -> BoxFuture<'a, Result<u64, ClusterError>> {
        Box::pin(async move {
            self.admit().await;
            let previous = self.shared.lock().claim_conditions.get(name).cloned().unwrap_or_default();
            let body = convert::nodeclaim_status_object(&status, &previous, &rfc3339(self.clock.now_millis()));
            let patch = json!({ "metadata": { "resourceVersion": resource_version.to_string() }, "status": body });
            let api: Api<crd::NodeClaim> = Api::all(self.client.clone());
            let out = api
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| self.api_error("nodeclaim", name, e))?;
            if let Some(cs) = out.status.as_ref().and_then(|s| s.conditions.clone()) {
                self.shared.lock().claim_conditions.insert(name.to_string(), cs);
            }
            Ok(version_of(&out.metadata))
        })
    }

    fn update_nodeclaim_metadata<'a>(
        &'a self,
        name: &'a str,
        update: NodeClaimUpdate,
        resource_version: u64,
    ) -> BoxFuture<'a, Result<u64, ClusterError>> {
        Box::pin(async move {
            self.admit().await;
            // Labels merge; finalizers are replaced whole, as read and changed, under the
            // read's resource version.
            let patch = json!({ "metadata": {
                "resourceVersion": resource_version.to_string(),
                "labels": update.labels,
                "finalizers": update.finalizers,
            } });
            let api: Api<crd::NodeClaim> = Api::all(self.client.clone());
            match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(out) => Ok(version_of(&out.metadata)),
                // The last finalizer removed from an object being deleted: it is gone.
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    Err(ClusterError::NotFound { kind: "nodeclaim", name: name.into() })
                }
                Err(e) => Err(self.api_error("nodeclaim", name, e)),
            }
        })
    }

    fn delete_nodeclaim<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<u64, ClusterError>> {
        Box::pin(async move {
            self.admit().await;
            let api: Api<crd::NodeClaim> = Api::all(self.client.clone());
            let out =
                api.delete(name, &DeleteParams::default()).await.map_err(|e| self.api_error("nodeclaim", name, e))?;
            Ok(out.left().map_or(0, |o| version_of(&o.metadata)))
        })
    }

    fn get_node<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Arc<Node>, ClusterError>> {
        Box::pin(async move {
            self.admit().await;
            let api: Api<k8s::Node> = Api::all(self.client.clone());
            let obj = api.get(name).await.map_err(|e| self.api_error("node", name, e))?;
            let node = convert::node(&convert::Ctx::new(format!("Node {name}")), &obj)
                .map_err(|e| conversion("node", name, e))?;
            Ok(Arc::new(node))
        })
    }

    fn update_node<'a>(
        &'a self,
        name: &'a str,
        update: NodeUpdate,
        resource_version: u64,
    ) -> BoxFuture<'a, Result<u64, ClusterError>> {
        Box::pin(async move {
            self.admit().await;
            // Labels merge (a patch only sets them); taints and finalizers are replaced whole,
            // as read and patched, under the read's resource version. The owner (at
            // registration) is added to the node's ownerReferences as Karpenter's registration
            // adds it: those the node has are read first and kept.
            let mut patch = json!({
                "metadata": {
                    "resourceVersion": resource_version.to_string(),
                    "labels": update.labels,
                    "finalizers": update.finalizers,
                },
                "spec": { "taints": taints_json(&update.taints) },
            });
            // The owner's uid, when the node does not carry that owner yet.
            let owner = update.owner_claim.as_ref().and_then(|claim| {
                let s = self.shared.lock();
                let owned = s.snap.nodes.get(name).is_some_and(|n| n.owner_claim.as_ref() == Some(claim));
                (!owned).then(|| (claim, s.claim_uids.get(claim).cloned()))
            });
            if let Some((claim, uid)) = owner {
                // Not cached yet (the claim's watch event is behind): the write is retried.
                let uid = uid.ok_or_else(|| ClusterError::Unavailable {
                    reason: format!("node {name}: the uid of its owner, NodeClaim {claim}, is not cached yet"),
                })?;
                patch["metadata"]["ownerReferences"] = self.owners_with(name, resource_version, claim, &uid).await?;
            }
            let api: Api<k8s::Node> = Api::all(self.client.clone());
            let out = api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| self.api_error("node", name, e))?;
            Ok(version_of(&out.metadata))
        })
    }

    fn delete_node<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<u64, ClusterError>> {
        Box::pin(async move {
            self.admit().await;
            let api: Api<k8s::Node> = Api::all(self.client.clone());
            let out = api.delete(name, &DeleteParams::default()).await.map_err(|e| self.api_error("node", name, e))?;
            Ok(out.left().map_or(0, |o| version_of(&o.metadata)))
        })
    }

    fn evict<'a>(&'a self, pod: &'a PodKey) -> BoxFuture<'a, Result<u64, ClusterError>> {
        Box::pin(async move {
            self.admit().await;
            let body = json!({
                "apiVersion": self.versions.eviction,
                "kind": "Eviction",
                "metadata": { "name": pod.name, "namespace": pod.namespace },
            });
            let url = format!("/api/v1/namespaces/{}/pods/{}/eviction", pod.namespace, pod.name);
            let req = http::Request::post(url)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(serde_json::to_vec(&body).unwrap_or_default())
                .map_err(|e| ClusterError::Unavailable { reason: format!("eviction request for {pod}: {e}") })?;
            match self.client.request::<serde_json::Value>(req).await {
                Ok(_) => Ok(self.shared.lock().snap.resource_version),
                Err(kube::Error::Api(s)) if s.code == 429 => {
                    // The eviction API answers 429 while a PodDisruptionBudget allows none.
                    let pdb = s
                        .details
                        .as_ref()
                        .and_then(|d| d.causes.iter().find(|c| c.reason == "DisruptionBudget"))
                        .map(|c| c.message.clone())
                        .unwrap_or_default();
                    if pdb.is_empty() && !s.message.contains("disruption budget") {
                        self.throttled(s.details.as_ref().map_or(0, |d| d.retry_after_seconds));
                        return Err(ClusterError::Throttled { kind: "pod", name: pod.to_string() });
                    }
                    Err(ClusterError::DisruptionBudget { pod: pod.to_string(), pdb })
                }
                // Several PodDisruptionBudgets cover the pod: the eviction subresource answers
                // 500 (an internal error) and will until the budgets are mended.
                Err(kube::Error::Api(s))
                    if s.code == 500 && s.message.contains("more than one PodDisruptionBudget") =>
                {
                    Err(ClusterError::ManyPdbs { pod: pod.to_string() })
                }
                // The pod's namespace is being deleted (the API refuses new content there,
                // evictions included): the namespace controller deletes the pod; the drain
                // waits for it to go, as after an eviction.
                Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("being terminated") => {
                    Ok(self.shared.lock().snap.resource_version)
                }
                Err(e) => Err(self.api_error("pod", &pod.to_string(), e)),
            }
        })
    }

    fn delete_pod<'a>(
        &'a self,
        pod: &'a PodKey,
        grace_seconds: Option<i64>,
    ) -> BoxFuture<'a, Result<u64, ClusterError>> {
        Box::pin(async move {
            self.admit().await;
            let api: Api<k8s::Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
            let params = DeleteParams {
                grace_period_seconds: grace_seconds.and_then(|g| u32::try_from(g.max(0)).ok()),
                ..DeleteParams::default()
            };
            let out = api.delete(&pod.name, &params).await.map_err(|e| self.api_error("pod", &pod.to_string(), e))?;
            Ok(out.left().map_or(0, |o| version_of(&o.metadata)))
        })
    }

    fn record_event(&self, event: Event) -> BoxFuture<'_, Result<(), ClusterError>> {
        Box::pin(async move {
            let (kind, api_version) = match event.kind {
                crate::ObjectKind::Pod => ("Pod", "v1"),
                crate::ObjectKind::Node => ("Node", "v1"),
                crate::ObjectKind::NodeClaim => ("NodeClaim", "karpenter.sh/v1"),
                crate::ObjectKind::NodePool => ("NodePool", "karpenter.sh/v1"),
            };
            let (namespace, name) = match event.name.split_once('/') {
                Some((ns, n)) if event.kind == crate::ObjectKind::Pod => (ns.to_string(), n.to_string()),
                _ => ("default".to_string(), event.name.clone()),
            };
            // The object's uid (cached, or read): `kubectl describe` lists the events whose
            // involvedObject names the object's uid.
            let uid = self.uid_of(event.kind, &namespace, &name).await;
            self.admit().await;
            let now = self.clock.now_millis();
            let seq = self.events.fetch_add(1, Ordering::Relaxed);
            let time = rfc3339(now);
            let body = json!({
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": { "name": format!("{name}.{now:x}{seq:x}"), "namespace": namespace },
                "involvedObject": {
                    "kind": kind,
                    "apiVersion": api_version,
                    "name": name,
                    "uid": uid,
                    "namespace": if event.kind == crate::ObjectKind::Pod { Some(&namespace) } else { None },
                },
                "reason": event.reason,
                "message": event.message,
                "type": if event.warning { "Warning" } else { "Normal" },
                "source": { "component": FIELD_MANAGER },
                "firstTimestamp": time,
                "lastTimestamp": time,
                "count": 1,
            });
            let ev: k8s::Event = serde_json::from_value(body)
                .map_err(|e| ClusterError::Unavailable { reason: format!("event for {kind} {name}: {e}") })?;
            let api: Api<k8s::Event> = Api::namespaced(self.client.clone(), &namespace);
            api.create(&PostParams::default(), &ev).await.map_err(|e| self.api_error("event", &name, e))?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use dovetail_core::clock::{Clock, ManualClock};
    use dovetail_core::nodepool::NodeClaimSpec;

    use crate::kube::test_server::serve;
    use crate::kube::{Bucket, KubeSettings, Versions, store::Shared};

    fn cluster(url: &str) -> KubeCluster {
        let client = kube::Client::try_from(kube::Config::new(url.parse().expect("url"))).expect("client");
        let clock = Arc::new(ManualClock::new());
        let now = clock.now_millis();
        KubeCluster {
            client,
            shared: Arc::new(Shared::new()),
            versions: Versions {
                policy: "policy/v1".into(),
                eviction: "policy/v1".into(),
                server: "1.30".into(),
                streaming_lists: false,
            },
            settings: KubeSettings::default(),
            clock,
            bucket: tokio::sync::Mutex::new(Bucket { tokens: 300.0, at: now }),
            paused_until: std::sync::atomic::AtomicU64::new(0),
            throttles: std::sync::atomic::AtomicU64::new(0),
            requests: std::sync::atomic::AtomicU64::new(0),
            events: std::sync::atomic::AtomicU64::new(0),
            tasks: Vec::new(),
        }
    }

    fn claim(name: &str, pool: &str) -> NodeClaim {
        NodeClaim {
            name: name.into(),
            spec: NodeClaimSpec { nodepool: pool.into(), ..NodeClaimSpec::default() },
            finalizers: Vec::new(),
            deleting: false,
            status: NodeClaimStatus::default(),
            resource_version: 0,
            created: None,
        }
    }

    /// A NodeClaim is created owned by its NodePool (the NodePool's uid from the cache, so
    /// that deleting the NodePool deletes it); for a NodePool the cache no longer holds (it
    /// was deleted while the claim was planned) nothing is created: the write is refused as
    /// NotFound, naming the NodePool, and never reaches the server, so no claim is left
    /// without an owner to launch an instance for nobody.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_nodeclaim_is_created_owned_by_its_nodepool_and_never_for_a_nodepool_gone_from_the_cache() {
        let answer = r#"{"apiVersion":"karpenter.sh/v1","kind":"NodeClaim","metadata":{"name":"web-a","resourceVersion":"7"},"spec":{"nodeClassRef":{"group":"karpenter.k8s.aws","kind":"EC2NodeClass","name":"default"},"requirements":[]}}"#;
        let (url, seen) = serve(vec![(201, answer.to_string()); 2]);
        let c = cluster(&url);
        c.shared.lock().pool_uids.insert("web".into(), "uid-web".into());

        let version = tokio::time::timeout(Duration::from_secs(30), c.create_nodeclaim(claim("web-a", "web")))
            .await
            .expect("answered")
            .expect("created");
        assert_eq!(version, 7);
        let requests = seen.lock().expect("log").clone();
        assert_eq!(requests.len(), 1, "{requests:?}");
        assert!(requests[0].0.starts_with("POST /apis/karpenter.sh/v1/nodeclaims"), "{requests:?}");
        let body: serde_json::Value = serde_json::from_str(&requests[0].1).expect("json body");
        let owners = &body["metadata"]["ownerReferences"];
        assert_eq!(owners[0]["kind"], "NodePool", "{body}");
        assert_eq!(owners[0]["name"], "web", "{body}");
        assert_eq!(owners[0]["uid"], "uid-web", "{body}");

        let refused = tokio::time::timeout(Duration::from_secs(30), c.create_nodeclaim(claim("gone-a", "gone")))
            .await
            .expect("answered");
        assert_eq!(refused, Err(ClusterError::NotFound { kind: "nodepool", name: "gone".into() }));
        assert_eq!(seen.lock().expect("log").len(), 1, "nothing more reached the server");
    }
}
