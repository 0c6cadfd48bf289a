//! The `x-goog-request-params` routing header every call carries (the write RPCs have no
//! routing annotation, so it is always added by hand), with `&routing_token=` after a
//! redirect, and the per-call gRPC deadline. Touches only request metadata.

use super::{bucket_path, Error, Result};
use std::time::Duration;
use tonic::metadata::MetadataValue;

/// The header name the service routes on.
pub(crate) const HEADER: &str = "x-goog-request-params";

/// The header value: `bucket=projects/_/buckets/NAME[&routing_token=TOKEN]`, unencoded.
pub(crate) fn params(bucket: &str, routing_token: Option<&str>) -> String {
    match routing_token {
        Some(t) if !t.is_empty() => format!("bucket={}&routing_token={t}", bucket_path(bucket)),
        _ => format!("bucket={}", bucket_path(bucket)),
    }
}

/// Wraps `msg` in a request with the routing header and, when given, a gRPC deadline.
pub(crate) fn request<T>(
    msg: T,
    bucket: &str,
    routing_token: Option<&str>,
    timeout: Option<Duration>,
) -> Result<tonic::Request<T>> {
    let value = params(bucket, routing_token);
    let value = MetadataValue::try_from(value.as_str()).map_err(|_| {
        Error::InvalidArgument(format!("bucket name not usable in a header: {value}"))
    })?;
    let mut req = tonic::Request::new(msg);
    req.metadata_mut().insert(HEADER, value);
    if let Some(t) = timeout {
        req.set_timeout(t);
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_the_full_bucket_path() {
        assert_eq!(params("b", None), "bucket=projects/_/buckets/b");
        assert_eq!(params("b", Some("")), "bucket=projects/_/buckets/b");
        assert_eq!(
            params("b", Some("tok-1")),
            "bucket=projects/_/buckets/b&routing_token=tok-1"
        );
    }

    #[test]
    fn request_carries_header_and_deadline() {
        let r = request((), "b", Some("t"), Some(Duration::from_secs(3))).unwrap();
        let v = r.metadata().get(HEADER).unwrap().to_str().unwrap();
        assert_eq!(v, "bucket=projects/_/buckets/b&routing_token=t");
        assert_eq!(r.metadata().get("grpc-timeout").unwrap(), "3000000u");
    }

    #[test]
    fn unusable_bucket_name_is_an_error_not_a_panic() {
        assert!(request((), "a\nb", None, None).is_err());
    }
}
