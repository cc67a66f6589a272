//! The cloud conformance suite: one set of checks every `CloudProvider` passes, run on the
//! sim cloud (`conformance::sim`) and on the AWS provider against moto (`conformance::aws`).

mod conformance {
    pub mod ami_seed;
    pub mod aws;
    pub mod moto;
    pub mod sim;
    pub mod suite;
}

mod aws_provider;
