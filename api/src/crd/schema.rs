//! The CRDs' schemas brought to Karpenter v1's shape after kube-derive generated them from the
//! types: the names block (categories, short names), the printer columns, enums, patterns,
//! bounds, list types, the defaults and the CEL rules (`x-kubernetes-validations`) Karpenter's
//! CRDs carry. kube-derive's `nullable` on optional fields stays (Karpenter has none): the 1.20
//! API server of the test suite reads an empty string in a custom object as `null`
//! ("status.conditions.message in body must be of type string: null" for a condition whose
//! message is ""), so without it an empty message or node name could not be written.
//!
//! The CEL rules are Karpenter's, with the bounds (`maxItems`, `maxProperties`, `maxLength`) its
//! CRDs give the fields they range over, so a 1.25+ server's cost estimate accepts them as it
//! accepts Karpenter's. A server older than 1.25 does not know `x-kubernetes-validations`: its
//! kubectl refuses the CRDs unless `--validate=false` and the server then drops the rules, so
//! dovetail's conversion checks the same rules itself and reports them on the NodePool (its
//! `ValidationSucceeded`, or `NodeClassReady` for its EC2NodeClass's). Rules over fields dovetail
//! does not model (capacity reservations, placement groups, network interfaces, EBS
//! initialization rates) are left out: a rule naming a field the schema lacks does not compile.

use dovetail_core::labels;
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
const NOT_EMPTY: &str = "self != ''";
const TAGS_NOT_EMPTY: (&str, &str) =
    ("self.all(k, k != '' && self[k] != '')", "empty tag keys or values aren't supported");

/// The `karpenter.k8s.aws` labels Karpenter lets users set and require, as a CEL list.
fn aws_labels() -> String {
    let keys = labels::WELL_KNOWN
        .iter()
        .copied()
        .chain([labels::EC2NODECLASS])
        .filter(|k| k.starts_with("karpenter.k8s.aws/"))
        .map(|k| format!("{k:?}"))
        .collect::<Vec<_>>();
    format!("[{}]", keys.join(", "))
}

/// Karpenter's rules on a label key (`self`) or, with `all`, on every key of a map.
fn label_rules(nodepool_key: bool, all: bool) -> Vec<(String, String)> {
    let each = |cond: String| if all { format!("self.all(x, {})", cond.replace("self", "x")) } else { cond };
    let mut rules = vec![(
        each(r#"self in ["karpenter.sh/capacity-type", "karpenter.sh/nodepool"] || !self.find("^([^/]+)").endsWith("karpenter.sh")"#.into()),
        r#"label domain "karpenter.sh" is restricted"#.to_string(),
    )];
    if nodepool_key {
        rules.push((
            each(r#"self != "karpenter.sh/nodepool""#.into()),
            r#"label "karpenter.sh/nodepool" is restricted"#.into(),
        ));
    }
    rules.push((
        each(r#"self != "kubernetes.io/hostname""#.into()),
        r#"label "kubernetes.io/hostname" is restricted"#.into(),
    ));
    rules.push((
        each(format!(r#"self in {} || !self.find("^([^/]+)").endsWith("karpenter.k8s.aws")"#, aws_labels())),
        r#"label domain "karpenter.k8s.aws" is restricted"#.into(),
    ));
    rules
}

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

/// Appends CEL rules, `(rule, message)`, to the schema at `path`.
fn cel<R: AsRef<str>, M: AsRef<str>>(
    root: &mut Value,
    crd: &str,
    path: &str,
    rules: &[(R, M)],
) -> Result<(), MissingPath> {
    let missing = || MissingPath { crd: crd.to_string(), path: path.to_string() };
    let obj = at(root, crd, path)?.as_object_mut().ok_or_else(missing)?;
    let list = obj.entry("x-kubernetes-validations").or_insert_with(|| json!([]));
    if let Some(list) = list.as_array_mut() {
        list.extend(rules.iter().map(|(r, m)| json!({"message": m.as_ref(), "rule": r.as_ref()})));
    }
    Ok(())
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
fn claim_spec(s: &mut Value, crd: &str, at_path: &str, nodepool: bool) -> Result<(), MissingPath> {
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
    cel(s, crd, &p("requirements[].key"), &label_rules(nodepool, false))?;
    cel(
        s,
        crd,
        &p("requirements"),
        &[
            (
                "self.all(x, x.operator == 'In' ? x.values.size() != 0 : true)",
                "requirements with operator 'In' must have a value defined",
            ),
            (
                "self.all(x, (x.operator == 'Gt' || x.operator == 'Lt' || x.operator == 'Gte' || x.operator == 'Lte') ? (x.values.size() == 1 && int(x.values[0]) >= 0) : true)",
                "requirements operator 'Gt', 'Lt', 'Gte', or 'Lte' must have a single positive integer value",
            ),
            (
                "self.all(x, (x.operator == 'In' && has(x.minValues)) ? x.values.size() >= x.minValues : true)",
                "requirements with 'minValues' must have at least that many values specified in the 'values' field",
            ),
        ],
    )?;
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
        cel(s, crd, &p(&format!("nodeClassRef.{f}")), &[(NOT_EMPTY, format!("{f} may not be empty"))])?;
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
    claim_spec(s, crd, "spec.template.spec", true)?;
    cel(
        s,
        crd,
        "spec",
        &[
            (
                "has(self.replicas) == has(oldSelf.replicas)",
                "Cannot transition NodePool between static (replicas set) and dynamic (replicas unset) provisioning modes",
            ),
            (
                "!has(self.replicas) || (!has(self.limits) || size(self.limits) == 0 || (size(self.limits) == 1 && 'nodes' in self.limits))",
                "only 'limits.nodes' is supported on static NodePools",
            ),
            ("!has(self.replicas) || !has(self.weight)", "'weight' is not supported on static NodePools"),
        ],
    )?;
    cel(
        s,
        crd,
        "spec.template.spec.nodeClassRef",
        &[
            ("self.group == oldSelf.group", "nodeClassRef.group is immutable"),
            ("self.kind == oldSelf.kind", "nodeClassRef.kind is immutable"),
        ],
    )?;
    cel(s, crd, "spec.template.metadata.labels", &label_rules(true, true))?;
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
    cel(
        s,
        crd,
        "spec.disruption.budgets",
        &[("self.all(x, has(x.schedule) == has(x.duration))", "'schedule' must be set with 'duration'")],
    )?;
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
    claim_spec(s, crd, "spec", false)?;
    cel(s, crd, "spec", &[("self == oldSelf", "spec is immutable")])?;
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
    let mut spec_rules = vec![(
        "(has(self.role) && !has(self.instanceProfile)) || (!has(self.role) && has(self.instanceProfile))".to_string(),
        "must specify exactly one of ['role', 'instanceProfile']".to_string(),
    )];
    for (alias, family) in [
        ("al2", "AL2"),
        ("al2023", "AL2023"),
        ("bottlerocket", "Bottlerocket"),
        ("windows2019", "Windows2019"),
        ("windows2022", "Windows2022"),
        ("windows2025", "Windows2025"),
    ] {
        spec_rules.push((
            format!(
                "!has(self.amiFamily) || (self.amiSelectorTerms.exists(x, has(x.alias) && x.alias.find('^[^@]+') == '{alias}') ? (self.amiFamily == 'Custom' || self.amiFamily == '{family}') : true)"
            ),
            format!("if set, amiFamily must be '{family}' or 'Custom' when using an {family} alias"),
        ));
    }
    spec_rules.push((
        "self.amiSelectorTerms.exists(x, has(x.alias)) ? true : has(self.amiFamily)".into(),
        "must specify amiFamily if amiSelectorTerms does not contain an alias".into(),
    ));
    cel(s, crd, "spec", &spec_rules)?;
    cel(
        s,
        crd,
        "spec.amiSelectorTerms",
        &[
            (
                "self.all(x, has(x.tags) || has(x.id) || has(x.name) || has(x.alias) || has(x.ssmParameter))",
                "expected at least one, got none, ['tags', 'id', 'name', 'alias', 'ssmParameter']",
            ),
            (
                "!self.exists(x, has(x.id) && (has(x.alias) || has(x.tags) || has(x.name) || has(x.owner)))",
                "'id' is mutually exclusive, cannot be set with a combination of other fields in amiSelectorTerms",
            ),
            (
                "!self.exists(x, has(x.alias) && (has(x.id) || has(x.tags) || has(x.name) || has(x.owner)))",
                "'alias' is mutually exclusive, cannot be set with a combination of other fields in amiSelectorTerms",
            ),
            (
                "!(self.exists(x, has(x.alias)) && self.size() != 1)",
                "'alias' is mutually exclusive, cannot be set with a combination of other amiSelectorTerms",
            ),
        ],
    )?;
    set(s, crd, "spec.amiSelectorTerms[].alias", json!({"maxLength": 30}))?;
    cel(
        s,
        crd,
        "spec.amiSelectorTerms[].alias",
        &[
            (
                "self.matches('^[a-zA-Z0-9]+@.+$')",
                "'alias' is improperly formatted, must match the format 'family@version'",
            ),
            (
                "self.split('@')[0] in ['al2','al2023','bottlerocket','windows2019','windows2022','windows2025']",
                "family is not supported, must be one of the following: 'al2', 'al2023', 'bottlerocket', 'windows2019', 'windows2022', 'windows2025'",
            ),
            (
                "self.split('@')[0] in ['windows2019','windows2022','windows2025'] ? self.split('@')[1] == 'latest' : true",
                "windows families may only specify version 'latest'",
            ),
        ],
    )?;
    set(s, crd, "spec.amiSelectorTerms[].id", json!({"pattern": "ami-[0-9a-z]+"}))?;
    set(s, crd, "spec.subnetSelectorTerms[].id", json!({"pattern": "subnet-[0-9a-z]+"}))?;
    set(s, crd, "spec.securityGroupSelectorTerms[].id", json!({"pattern": "sg-[0-9a-z]+"}))?;
    // Karpenter's subnet terms select by tags or id only.
    if let Some(props) = at(s, crd, "spec.subnetSelectorTerms[]")?.get_mut("properties").and_then(Value::as_object_mut)
    {
        props.remove("name");
    }
    for terms in ["amiSelectorTerms", "subnetSelectorTerms", "securityGroupSelectorTerms"] {
        let tags = format!("spec.{terms}[].tags");
        set(s, crd, &tags, json!({"maxProperties": 20}))?;
        cel(s, crd, &tags, &[TAGS_NOT_EMPTY])?;
    }
    cel(
        s,
        crd,
        "spec.subnetSelectorTerms",
        &[
            ("self.size() != 0", "subnetSelectorTerms cannot be empty"),
            ("self.all(x, has(x.tags) || has(x.id))", "expected at least one, got none, ['tags', 'id']"),
            (
                "!self.all(x, has(x.id) && has(x.tags))",
                "'id' is mutually exclusive, cannot be set with a combination of other fields in a subnet selector term",
            ),
        ],
    )?;
    cel(
        s,
        crd,
        "spec.securityGroupSelectorTerms",
        &[
            ("self.size() != 0", "securityGroupSelectorTerms cannot be empty"),
            (
                "self.all(x, has(x.tags) || has(x.id) || has(x.name))",
                "expected at least one, got none, ['tags', 'id', 'name']",
            ),
            (
                "!self.all(x, has(x.id) && (has(x.tags) || has(x.name)))",
                "'id' is mutually exclusive, cannot be set with a combination of other fields in a security group selector term",
            ),
            (
                "!self.all(x, has(x.name) && (has(x.tags) || has(x.id)))",
                "'name' is mutually exclusive, cannot be set with a combination of other fields in a security group selector term",
            ),
        ],
    )?;
    cel(s, crd, "spec.role", &[(NOT_EMPTY, "role cannot be empty")])?;
    cel(s, crd, "spec.instanceProfile", &[(NOT_EMPTY, "instanceProfile cannot be empty")])?;
    let mut tag_rules = vec![("self.all(k, k != '')".to_string(), "empty tag keys aren't supported".to_string())];
    for (rule, tag) in [
        ("self.all(k, k !='eks:eks-cluster-name')", "eks:eks-cluster-name"),
        ("self.all(k, !k.startsWith('kubernetes.io/cluster') )", "kubernetes.io/cluster/"),
        ("self.all(k, k != 'karpenter.sh/nodepool')", "karpenter.sh/nodepool"),
        ("self.all(k, k !='karpenter.sh/nodeclaim')", "karpenter.sh/nodeclaim"),
        ("self.all(k, k !='karpenter.k8s.aws/ec2nodeclass')", "karpenter.k8s.aws/ec2nodeclass"),
    ] {
        tag_rules.push((rule.to_string(), format!("tag contains a restricted tag matching {tag}")));
    }
    cel(s, crd, "spec.tags", &tag_rules)?;
    cel(
        s,
        crd,
        "spec.blockDeviceMappings",
        &[(
            "self.filter(x, has(x.rootVolume)?x.rootVolume==true:false).size() <= 1",
            "must have only one blockDeviceMappings with rootVolume",
        )],
    )?;
    cel(
        s,
        crd,
        "spec.blockDeviceMappings[].ebs",
        &[("has(self.snapshotID) || has(self.volumeSize)", "snapshotID or volumeSize must be defined")],
    )?;
    set(
        s,
        crd,
        "spec.metadataOptions",
        json!({"default": {"httpEndpoint": "enabled", "httpProtocolIPv6": "disabled",
                           "httpPutResponseHopLimit": 1, "httpTokens": "required"}}),
    )?;
    set(s, crd, "spec.metadataOptions.httpEndpoint", json!({"enum": ["enabled", "disabled"], "default": "enabled"}))?;
    set(
        s,
        crd,
        "spec.metadataOptions.httpProtocolIPv6",
        json!({"enum": ["enabled", "disabled"], "default": "disabled"}),
    )?;
    set(s, crd, "spec.metadataOptions.httpPutResponseHopLimit", json!({"minimum": 1, "maximum": 64, "default": 1}))?;
    set(s, crd, "spec.metadataOptions.httpTokens", json!({"enum": ["required", "optional"], "default": "required"}))?;
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
