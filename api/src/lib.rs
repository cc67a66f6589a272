//! dovetail-api: the Kubernetes-facing side of dovetail.
//!
//! - [`crd`]: the `NodePool`, `NodeClaim` and `EC2NodeClass` custom resources, field for
//!   field as Karpenter v1 defines them, with kube-derive.
//! - [`convert`]: conversion of those and of Pods, workloads and Nodes into
//!   `dovetail-core` types, validating as the API server and Karpenter do, with errors that
//!   name the object and the field.
//! - [`manifest`]: multi-document YAML in, domain objects out (what `dovetail plan` reads).

pub mod convert;
pub mod crd;
pub mod manifest;

pub use manifest::{Manifest, ManifestError};
