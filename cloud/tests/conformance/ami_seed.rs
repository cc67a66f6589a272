//! The EKS-optimized AMI parameters seeded in moto, which keeps `/aws/...` to itself: the
//! alias `al2023@latest` of Kubernetes `kubernetes_version` names moto's newest AL2023 image
//! of each architecture, as AWS publishes them under `/aws/service/eks/optimized-ami`. Shared
//! by the cloud conformance tests and `tests/kube.rs` (which includes this file by path).

pub async fn seed_ami_parameters(
    ec2: &aws_sdk_ec2::Client,
    ssm: &aws_sdk_ssm::Client,
    kubernetes_version: &str,
    prefix: &str,
) {
    let found = super::moto::setup("describing the AL2023 images", || {
        ec2.describe_images()
            .owners("amazon")
            .filters(aws_sdk_ec2::types::Filter::builder().name("name").values("al2023-ami-2023.*").build())
            .send()
    })
    .await;
    let params =
        dovetail_cloud::aws::AmiParameters { kubernetes_version: kubernetes_version.into(), prefix: prefix.into() };
    for arch in ["x86_64", "arm64"] {
        let image = found
            .images()
            .iter()
            .filter(|i| i.architecture().map(|a| a.as_str()) == Some(arch))
            .filter(|i| !i.name().unwrap_or_default().contains("minimal"))
            .max_by(|a, b| a.creation_date().cmp(&b.creation_date()).then(a.name().cmp(&b.name())))
            .and_then(|i| i.image_id())
            .expect("an AL2023 image in moto")
            .to_string();
        let name = dovetail_cloud::aws::alias_parameter(&params, "al2023", "latest", arch).expect("al2023 path");
        super::moto::setup("seeding the AMI parameter", || {
            ssm.put_parameter()
                .name(name.clone())
                .value(image.clone())
                .r#type(aws_sdk_ssm::types::ParameterType::String)
                .overwrite(true)
                .send()
        })
        .await;
    }
}
