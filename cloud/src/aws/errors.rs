//! EC2 and SQS errors mapped onto [`CloudError`].

use std::time::Duration;

use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};

use crate::CloudError;

/// Fleet error codes that mean "no capacity for this offering" (Karpenter reference 2.5).
pub const CAPACITY_CODES: [&str; 5] = [
    "InsufficientInstanceCapacity",
    "MaxSpotInstanceCountExceeded",
    "VcpuLimitExceeded",
    "UnfulfillableCapacity",
    "InsufficientFreeAddressesInSubnet",
];

/// Error codes of EC2's and SQS's request throttling.
const THROTTLE_CODES: [&str; 5] =
    ["RequestLimitExceeded", "Throttling", "ThrottlingException", "RequestThrottled", "TooManyRequestsException"];

/// How long a throttled caller should wait: EC2 sends no Retry-After, and its buckets refill
/// at least a token per second (`performance-anchors.md` 2.1).
pub const THROTTLE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Maps an SDK error of `action` by its code.
pub fn from_sdk<E, R>(action: &str, err: SdkError<E, R>) -> CloudError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug,
{
    let code = err.code().map(str::to_string);
    let message = err.message().map(str::to_string).unwrap_or_else(|| format!("{err:?}"));
    from_code(action, code.as_deref(), &message)
}

/// Maps an error code (from an API error or a fleet's error list).
pub fn from_code(action: &str, code: Option<&str>, message: &str) -> CloudError {
    match code {
        Some(c) if THROTTLE_CODES.contains(&c) => {
            CloudError::Throttled { action: action.to_string(), retry_after: THROTTLE_RETRY_AFTER }
        }
        Some(c) if CAPACITY_CODES.contains(&c) => CloudError::InsufficientCapacity { offerings: Vec::new() },
        Some(c) if c.starts_with("InvalidInstanceID.NotFound") => {
            CloudError::NotFound { id: message.split('\'').nth(1).unwrap_or_default().to_string() }
        }
        Some(c)
            if c.starts_with("Invalid")
                || c.starts_with("Missing")
                || c == "UnauthorizedOperation"
                || c == "AccessDenied"
                || c == "AuthFailure"
                || c == "OptInRequired" =>
        {
            CloudError::Invalid { what: action.to_string(), reason: format!("{c}: {message}") }
        }
        Some(c) => CloudError::Transient { message: format!("{action}: {c}: {message}") },
        None => CloudError::Transient { message: format!("{action}: {message}") },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_the_variants_callers_branch_on() {
        assert!(matches!(from_code("CreateFleet", Some("RequestLimitExceeded"), ""), CloudError::Throttled { .. }));
        assert!(matches!(
            from_code("CreateFleet", Some("InsufficientInstanceCapacity"), ""),
            CloudError::InsufficientCapacity { .. }
        ));
        assert!(matches!(
            from_code("DescribeImages", Some("InvalidAMIID.Malformed"), "bad"),
            CloudError::Invalid { .. }
        ));
        assert!(matches!(from_code("x", Some("InternalError"), ""), CloudError::Transient { .. }));
        assert_eq!(
            from_code("DescribeInstances", Some("InvalidInstanceID.NotFound"), "The instance ID 'i-1' does not exist"),
            CloudError::NotFound { id: "i-1".into() }
        );
    }
}
