//! The CRDs' schemas brought to Karpenter v1's shape after kube-derive generated them from the
//! types: the names block (categories, short names), the printer columns, enums, patterns,
//! bounds, list types and the defaults Karpenter's CRDs carry. kube-derive's `nullable` on
//! optional fields stays (Karpenter has none): the 1.20 API server of the test suite reads an
//! empty string in a custom object as `null` ("status.conditions.message in body must be of
//! type string: null" for a condition whose message is ""), so without it an empty message
//! or node name could not be written. Everything here is accepted
//! by every `apiextensions.k8s.io/v1` server dovetail supports (1.20 and later); Karpenter's
//! CEL rules are not written (a 1.20 server's kubectl refuses `x-kubernetes-validations`),
//! dovetail's conversion checks the same rules and reports them on the object.

use serde_json::{Value, json};

/// A schema path that does not exist in the generated CRD (a type changed without this file).
#[derive(Debug, thiserror::Error)]
#[error("{crd}: no schema at {path}")]
pub struct MissingPath {
    pub crd: String,
    pub path: String,
}

/// `^(([0-9]+(s|m|h))+|Never)$`: a duration or `Never` (expireAfter, consolidateAfter).
const DURATION_OR_NEVER: &str = r"^(([0-9]+(s|m|h))+|Never)$";
/// `terminationGracePeriod`: a duration, never `Never`.
const DURATION: &str = r"^([0-9]+(s|m|h))+$";
const LABEL_KEY: &str =
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*(\/))?([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$";
const LABEL_VALUE: &str = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";
const OPERATORS: [&str; 8] = ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Gte", "Lte"];

/// The schema node at `path` under `openAPIV3Schema`: dot-separated property names, `[]` for
/// an array's items, `{}` for a map's values.
fn at<'v>(root: &'v mut Value, crd: &str, path: &str) -> Result<&'v mut Value, MissingPath> {
    let missing = || MissingPath { crd: crd.to_string(), path: path.to_string() };
    let mut node = root;
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (name, suffix) = match part.find(['[', '{']) {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !name.is_empty() {
            node = node.get_mut("properties").and_then(|p| p.get_mut(name)).ok_or_else(missing)?;
        }
        for s in suffix.as_bytes().chunks(2) {
            node = match s {
                b"[]" => node.get_mut("items"),
                b"{}" => node.get_mut("additionalProperties"),
                _ => None,
            }
            .ok_or_else(missing)?;
        }
    }
    Ok(node)
}

/// Sets `fields` on the schema at `path`.
fn set(root: &mut Value, crd: &str, path: &str, fields: Value) -> Result<(), MissingPath> {
    let missing = || MissingPath { crd: crd.to_string(), path: path.to_string() };
    let obj = at(root, crd, path)?.as_object_mut().ok_or_else(missing)?;
    match fields {
        Value::Object(add) => {
            obj.extend(add);
            Ok(())
        }
        _ => Err(missing()),
    }
}

/// Removes keywords from the schema at `path`.
fn unset(root: &mut Value, crd: &str, path: &str, keys: &[&str]) -> Result<(), MissingPath> {
    if let Some(obj) = at(root, crd, path)?.as_object_mut() {
        for k in keys {
            obj.remove(*k);
        }
    }
    Ok(())
}

/// The requirement, taint and nodeClassRef schemas NodePool's template and NodeClaim share.
fn claim_spec(s: &mut Value, crd: &str, at_path: &str) -> Result<(), MissingPath> {
    let p = |rest: &str| format!("{at_path}.{rest}");
    set(
        s,
        crd,
        &p("requirements"),
        json!({"maxItems": 100, "x-kubernetes-list-type": "atomic",
                "description": "Requirements are layered with GetLabels and applied to every node."}),
    )?;
    unset(s, crd, &p("requirements"), &["default"])?;
    set(s, crd, &p("requirements[].key"), json!({"maxLength": 316, "pattern": LABEL_KEY}))?;
    set(s, crd, &p("requirements[].operator"), json!({"enum": OPERATORS}))?;
    set(s, crd, &p("requirements[].values"), json!({"x-kubernetes-list-type": "atomic"}))?;
    set(s, crd, &p("requirements[].minValues"), json!({"minimum": 1, "maximum": 50}))?;
    unset(s, crd, &p("requirements[].minValues"), &["format"])?;
    for taints in ["taints", "startupTaints"] {
        set(s, crd, &p(taints), json!({"x-kubernetes-list-type": "atomic"}))?;
        set(
            s,
            crd,
            &p(&format!("{taints}[].effect")),
            json!({"enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]}),
        )?;
        set(s, crd, &p(&format!("{taints}[].key")), json!({"minLength": 1, "pattern": LABEL_KEY}))?;
        set(s, crd, &p(&format!("{taints}[].value")), json!({"pattern": LABEL_KEY}))?;
    }
    set(s, crd, &p("nodeClassRef.group"), json!({"pattern": "^[^/]*$"}))?;
    for f in ["group", "kind", "name"] {
        unset(s, crd, &p(&format!("nodeClassRef.{f}")), &["default"])?;
    }
    set(s, crd, &p("nodeClassRef"), json!({"required": ["group", "kind", "name"]}))?;
    set(s, crd, &p("terminationGracePeriod"), json!({"pattern": DURATION}))?;
    Ok(())
}

fn conditions(s: &mut Value, crd: &str, path: &str, listed: bool) -> Result<(), MissingPath> {
    if listed {
        set(s, crd, path, json!({"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}))?;
    }
    set(s, crd, &format!("{path}[].status"), json!({"enum": ["True", "False", "Unknown"]}))?;
    set(s, crd, &format!("{path}[].lastTransitionTime"), json!({"format": "date-time"}))?;
    set(s, crd, &format!("{path}[].observedGeneration"), json!({"minimum": 0}))?;
    set(s, crd, &format!("{path}[].message"), json!({"maxLength": 32768}))?;
    set(s, crd, &format!("{path}[].reason"), json!({"maxLength": 1024}))?;
    set(s, crd, &format!("{path}[].type"), json!({"maxLength": 316}))
}

fn nodepool(s: &mut Value, crd: &str) -> Result<(), MissingPath> {
    set(s, crd, "", json!({"required": ["spec"]}))?;
    claim_spec(s, crd, "spec.template.spec")?;
    set(s, crd, "spec.template", json!({"required": ["spec"]}))?;
    set(s, crd, "spec.template.spec", json!({"required": ["nodeClassRef", "requirements"]}))?;
    set(s, crd, "spec.template.spec.expireAfter", json!({"default": "720h", "pattern": DURATION_OR_NEVER}))?;
    set(s, crd, "spec.template.metadata.labels", json!({"maxProperties": 100, "x-kubernetes-map-type": "atomic"}))?;
    set(s, crd, "spec.template.metadata.labels{}", json!({"maxLength": 63, "pattern": LABEL_VALUE}))?;
    set(s, crd, "spec.template.metadata.annotations", json!({"x-kubernetes-map-type": "granular"}))?;
    set(s, crd, "spec.weight", json!({"minimum": 1, "maximum": 100}))?;
    set(s, crd, "spec.replicas", json!({"minimum": 0}))?;
    set(s, crd, "spec.disruption", json!({"default": {"consolidateAfter": "0s"}}))?;
    set(
        s,
        crd,
        "spec.disruption.consolidationPolicy",
        json!({"enum": ["WhenEmpty", "WhenEmptyOrUnderutilized", "Balanced"], "default": "WhenEmptyOrUnderutilized"}),
    )?;
    set(s, crd, "spec.disruption.consolidateAfter", json!({"default": "0s", "pattern": DURATION_OR_NEVER}))?;
    set(
        s,
        crd,
        "spec.disruption.budgets",
        json!({"maxItems": 50, "x-kubernetes-list-type": "atomic", "default": [{"nodes": "10%"}]}),
    )?;
    set(s, crd, "spec.disruption.budgets[]", json!({"required": ["nodes"]}))?;
    set(
        s,
        crd,
        "spec.disruption.budgets[].nodes",
        json!({"default": "10%", "pattern": r"^((100|[0-9]{1,2})%|[0-9]+)$"}),
    )?;
    set(
        s,
        crd,
        "spec.disruption.budgets[].schedule",
        json!({"pattern": r"^(@(annually|yearly|monthly|weekly|daily|midnight|hourly))|((.+)\s(.+)\s(.+)\s(.+)\s(.+))$"}),
    )?;
    set(
        s,
        crd,
        "spec.disruption.budgets[].duration",
        json!({"pattern": r"^((([0-9]+(h|m))|([0-9]+h[0-9]+m))(0s)?)$"}),
    )?;
    set(s, crd, "spec.disruption.budgets[].reasons", json!({"maxItems": 50, "x-kubernetes-list-type": "set"}))?;
    set(s, crd, "spec.disruption.budgets[].reasons[]", json!({"enum": ["Underutilized", "Empty", "Drifted"]}))?;
    conditions(s, crd, "status.conditions", true)
}

fn nodeclaim(s: &mut Value, crd: &str) -> Result<(), MissingPath> {
    set(s, crd, "", json!({"required": ["spec"]}))?;
    claim_spec(s, crd, "spec")?;
    set(s, crd, "spec", json!({"required": ["nodeClassRef", "requirements"]}))?;
    set(s, crd, "spec.expireAfter", json!({"default": "720h", "pattern": DURATION_OR_NEVER}))?;
    conditions(s, crd, "status.conditions", true)
}

fn ec2nodeclass(s: &mut Value, crd: &str) -> Result<(), MissingPath> {
    for terms in ["subnetSelectorTerms", "securityGroupSelectorTerms", "amiSelectorTerms"] {
        unset(s, crd, &format!("spec.{terms}"), &["default"])?;
        set(s, crd, &format!("spec.{terms}"), json!({"maxItems": 30}))?;
    }
    set(s, crd, "spec.amiSelectorTerms", json!({"minItems": 1}))?;
    set(
        s,
        crd,
        "spec",
        json!({"required": ["amiSelectorTerms", "securityGroupSelectorTerms", "subnetSelectorTerms"]}),
    )?;
    set(s, crd, "spec.instanceStorePolicy", json!({"enum": ["RAID0"]}))?;
    set(
        s,
        crd,
        "spec.amiFamily",
        json!({"enum": ["AL2", "AL2023", "Bottlerocket", "Custom", "Windows2019", "Windows2022", "Windows2025"]}),
    )?;
    set(s, crd, "spec.blockDeviceMappings", json!({"maxItems": 50}))?;
    unset(s, crd, "spec.blockDeviceMappings[].rootVolume", &["default"])?;
    set(
        s,
        crd,
        "spec.blockDeviceMappings[].ebs.volumeType",
        json!({"enum": ["standard", "io1", "io2", "gp2", "sc1", "st1", "gp3"]}),
    )?;
    conditions(s, crd, "status.conditions", false)
}

/// The CRD's names block and columns as Karpenter's, and its schema shaped (see the module).
pub fn shape(crd: &mut Value) -> Result<(), MissingPath> {
    let name = crd["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let names = &mut crd["spec"]["names"];
    names["categories"] = json!(["karpenter"]);
    names["listKind"] = json!(format!("{}List", names["kind"].as_str().unwrap_or_default()));
    // Karpenter gives NodePool and NodeClaim no short names (EC2NodeClass gets its own below).
    if let Some(names) = crd["spec"]["names"].as_object_mut() {
        names.remove("shortNames");
    }
    let columns = match name.as_str() {
        "nodepools.karpenter.sh" => {
            crd["spec"]["versions"][0]["subresources"]["scale"] =
                json!({"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.nodes"});
            json!([
                {"jsonPath": ".spec.template.spec.nodeClassRef.name", "name": "NodeClass", "type": "string"},
                {"jsonPath": ".status.nodes", "name": "Nodes", "type": "string"},
                {"jsonPath": ".status.conditions[?(@.type==\"Ready\")].status", "name": "Ready", "type": "string"},
                {"jsonPath": ".metadata.creationTimestamp", "name": "Age", "type": "date"},
                {"jsonPath": ".spec.weight", "name": "Weight", "priority": 1, "type": "integer"},
                {"jsonPath": ".status.resources.cpu", "name": "CPU", "priority": 1, "type": "string"},
                {"jsonPath": ".status.resources.memory", "name": "Memory", "priority": 1, "type": "string"},
            ])
        }
        "nodeclaims.karpenter.sh" => {
            json!([
                {"jsonPath": ".metadata.labels.node\\.kubernetes\\.io/instance-type", "name": "Type", "type": "string"},
                {"jsonPath": ".metadata.labels.karpenter\\.sh/capacity-type", "name": "Capacity", "type": "string"},
                {"jsonPath": ".metadata.labels.topology\\.kubernetes\\.io/zone", "name": "Zone", "type": "string"},
                {"jsonPath": ".status.nodeName", "name": "Node", "type": "string"},
                {"jsonPath": ".status.conditions[?(@.type==\"Ready\")].status", "name": "Ready", "type": "string"},
                {"jsonPath": ".metadata.creationTimestamp", "name": "Age", "type": "date"},
                {"jsonPath": ".status.imageID", "name": "ImageID", "priority": 1, "type": "string"},
                {"jsonPath": ".status.providerID", "name": "ID", "priority": 1, "type": "string"},
                {"jsonPath": ".metadata.labels.karpenter\\.sh/nodepool", "name": "NodePool", "priority": 1, "type": "string"},
                {"jsonPath": ".spec.nodeClassRef.name", "name": "NodeClass", "priority": 1, "type": "string"},
                {"jsonPath": ".status.conditions[?(@.type==\"Drifted\")].status", "name": "Drifted", "priority": 1, "type": "string"},
            ])
        }
        "ec2nodeclasses.karpenter.k8s.aws" => {
            crd["spec"]["names"]["shortNames"] = json!(["ec2nc", "ec2ncs"]);
            json!([
                {"jsonPath": ".status.conditions[?(@.type==\"Ready\")].status", "name": "Ready", "type": "string"},
                {"jsonPath": ".metadata.creationTimestamp", "name": "Age", "type": "date"},
                {"jsonPath": ".spec.role", "name": "Role", "priority": 1, "type": "string"},
            ])
        }
        _ => return Err(MissingPath { crd: name, path: "(not a CRD dovetail serves)".into() }),
    };
    let version = &mut crd["spec"]["versions"][0];
    version["additionalPrinterColumns"] = columns;
    let schema = &mut version["schema"]["openAPIV3Schema"];
    match name.as_str() {
        "nodepools.karpenter.sh" => nodepool(schema, &name),
        "nodeclaims.karpenter.sh" => nodeclaim(schema, &name),
        _ => ec2nodeclass(schema, &name),
    }
}
