//! The catalog from EC2: DescribeInstanceTypes (paginated), DescribeInstanceTypeOfferings per
//! zone, DescribeAvailabilityZones; on-demand prices from the built-in table, spot prices
//! from DescribeSpotPriceHistory or the built-in table.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_ec2::Client;
use aws_sdk_ec2::types::{EbsOptimizedSupport, EphemeralNvmeSupport, Filter, LocationType};
use dovetail_core::catalog::{Catalog, GpuInfo, InstanceTypeInfo, Zone};

use super::errors::from_sdk;
use crate::CloudError;

/// Where spot prices come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpotPrices {
    /// DescribeSpotPriceHistory (the latest price per type, lowest over zones).
    History,
    /// The built-in table (the sample's ratio to on-demand, else 0.37).
    BuiltIn,
}

/// Reads the region's catalog.
pub async fn load(ec2: &Client, region: &str, spot: SpotPrices) -> Result<Catalog, CloudError> {
    let builtin = Catalog::embedded("us-east-1").ok();
    let builtin_prices: HashMap<&str, (Option<f64>, Option<f64>)> = builtin
        .as_ref()
        .map(|c| c.instance_types.iter().map(|t| (t.name.as_str(), (t.on_demand_price, t.spot_price))).collect())
        .unwrap_or_default();
    // Karpenter takes the network bandwidth label from its own table (the API has only
    // vague text for many types); the built-in catalog carries that table.
    let builtin_network: HashMap<&str, u64> = builtin
        .as_ref()
        .map(|c| c.instance_types.iter().filter_map(|t| Some((t.name.as_str(), t.network_bandwidth_mbps?))).collect())
        .unwrap_or_default();

    let azs = ec2.describe_availability_zones().send().await.map_err(|e| from_sdk("DescribeAvailabilityZones", e))?;
    let zones: Vec<Zone> = azs
        .availability_zones()
        .iter()
        .filter_map(|z| Some(Zone { name: z.zone_name()?.to_string(), id: z.zone_id()?.to_string() }))
        .collect();

    // Zones offering each type.
    let mut offered: HashMap<String, Vec<String>> = HashMap::new();
    for z in &zones {
        let mut token: Option<String> = None;
        loop {
            let page = ec2
                .describe_instance_type_offerings()
                .location_type(LocationType::AvailabilityZone)
                .filters(Filter::builder().name("location").values(&z.name).build())
                .set_next_token(token.clone())
                .send()
                .await
                .map_err(|e| from_sdk("DescribeInstanceTypeOfferings", e))?;
            for o in page.instance_type_offerings() {
                if let Some(t) = o.instance_type() {
                    offered.entry(t.as_str().to_string()).or_default().push(z.name.clone());
                }
            }
            token = page.next_token().map(str::to_string);
            if token.is_none() {
                break;
            }
        }
    }

    let spot_history = match spot {
        SpotPrices::History => spot_history(ec2).await?,
        SpotPrices::BuiltIn => HashMap::new(),
    };

    let mut types = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = ec2
            .describe_instance_types()
            .set_next_token(token.clone())
            .send()
            .await
            .map_err(|e| from_sdk("DescribeInstanceTypes", e))?;
        for t in page.instance_types() {
            let Some(name) = t.instance_type().map(|n| n.as_str().to_string()) else { continue };
            let Some(arch) = t.processor_info().and_then(|p| {
                p.supported_architectures().iter().find_map(|a| match a.as_str() {
                    "x86_64" => Some("amd64"),
                    "arm64" => Some("arm64"),
                    _ => None,
                })
            }) else {
                continue;
            };
            let (Some(vcpu), Some(memory_mib)) =
                (t.v_cpu_info().and_then(|v| v.default_v_cpus()), t.memory_info().and_then(|m| m.size_in_mib()))
            else {
                continue;
            };
            let net = t.network_info();
            let gpu = t.gpu_info().and_then(|g| g.gpus().first()).map(|g| GpuInfo {
                name: g.name().unwrap_or_default().to_lowercase(),
                manufacturer: g.manufacturer().unwrap_or_default().to_lowercase(),
                count: g.count().unwrap_or(0).max(0) as u32,
                memory_mib: g.memory_info().and_then(|m| m.size_in_mib()).unwrap_or(0).max(0) as u64,
            });
            let (od, builtin_spot) = builtin_prices.get(name.as_str()).copied().unwrap_or((None, None));
            let spot_price = match spot {
                SpotPrices::History => spot_history.get(&name).copied(),
                SpotPrices::BuiltIn => builtin_spot,
            };
            types.push(InstanceTypeInfo {
                vcpu: vcpu.max(0) as u32,
                memory_mib: memory_mib.max(0) as u64,
                arch: arch.to_string(),
                cpu_manufacturer: t.processor_info().and_then(|p| p.manufacturer()).map(str::to_lowercase),
                sustained_clock_ghz: t.processor_info().and_then(|p| p.sustained_clock_speed_in_ghz()),
                hypervisor: t.hypervisor().map(|h| h.as_str().to_string()),
                bare_metal: t.bare_metal().unwrap_or(false),
                burstable: t.burstable_performance_supported().unwrap_or(false),
                enis: net.and_then(|n| n.maximum_network_interfaces()).unwrap_or(1).max(1) as u32,
                ipv4_per_eni: net.and_then(|n| n.ipv4_addresses_per_interface()).unwrap_or(1).max(1) as u32,
                branch_enis: None,
                efa: u32::from(net.and_then(|n| n.efa_supported()).unwrap_or(false)),
                local_nvme_gb: t
                    .instance_storage_info()
                    .filter(|s| s.nvme_support().is_some_and(|n| *n != EphemeralNvmeSupport::Unsupported))
                    .and_then(|s| s.total_size_in_gb())
                    .map(|g| g.max(0) as u64),
                local_storage_gb: t.instance_storage_info().and_then(|s| s.total_size_in_gb()).map(|g| g.max(0) as u64),
                network_bandwidth_mbps: builtin_network.get(name.as_str()).copied(),
                ebs_bandwidth_mbps: t
                    .ebs_info()
                    .filter(|e| e.ebs_optimized_support() == Some(&EbsOptimizedSupport::Default))
                    .and_then(|e| e.ebs_optimized_info())
                    .and_then(|o| o.maximum_bandwidth_in_mbps())
                    .map(|b| b.max(0) as u64),
                gpu,
                neuron: None,
                usage_classes: t.supported_usage_classes().iter().map(|u| u.as_str().to_string()).collect(),
                zones: offered.remove(&name).unwrap_or_default(),
                on_demand_price: od,
                spot_price,
                name,
            });
        }
        token = page.next_token().map(str::to_string);
        if token.is_none() {
            break;
        }
    }
    types.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Catalog {
        format: dovetail_core::catalog::FORMAT.to_string(),
        region: region.to_string(),
        zones,
        instance_types: types,
    })
}

/// The latest Linux spot price per type (lowest over zones), from the last day of history.
pub(super) async fn spot_history(ec2: &Client) -> Result<HashMap<String, f64>, CloudError> {
    let mut latest: BTreeMap<(String, String), (i64, f64)> = BTreeMap::new();
    let mut token: Option<String> = None;
    for _page in 0..200 {
        let page = ec2
            .describe_spot_price_history()
            .product_descriptions("Linux/UNIX")
            .set_next_token(token.clone())
            .send()
            .await
            .map_err(|e| from_sdk("DescribeSpotPriceHistory", e))?;
        for p in page.spot_price_history() {
            let (Some(t), Some(z), Some(price)) = (p.instance_type(), p.availability_zone(), p.spot_price()) else {
                continue;
            };
            let Ok(price) = price.parse::<f64>() else { continue };
            let at = p.timestamp().map(|d| d.secs()).unwrap_or(0);
            let e = latest.entry((t.as_str().to_string(), z.to_string())).or_insert((at, price));
            if at > e.0 {
                *e = (at, price);
            }
        }
        token = page.next_token().filter(|t| !t.is_empty()).map(str::to_string);
        if token.is_none() {
            break;
        }
    }
    let mut out: HashMap<String, f64> = HashMap::new();
    for ((t, _), (_, price)) in latest {
        let e = out.entry(t).or_insert(price);
        *e = e.min(price);
    }
    Ok(out)
}
