//! Bucket names as the wire spells them (`projects/_/buckets/NAME`) and the rule for a plain
//! name: what every service of the emulator checks before it looks a bucket up.

use tonic::Status;

/// The wire name of a bucket.
pub(crate) fn bucket_path(bucket: &str) -> String {
    format!("projects/_/buckets/{bucket}")
}

/// The bucket name out of `projects/_/buckets/NAME` (or a bare name).
pub(crate) fn parse_bucket(path: &str) -> Result<String, Status> {
    let name = path
        .strip_prefix("projects/_/buckets/")
        .or_else(|| {
            path.strip_prefix("projects/")?
                .split_once("/buckets/")
                .map(|x| x.1)
        })
        .unwrap_or(path);
    check_bucket_name(name)?;
    Ok(name.to_string())
}

/// Refuses bucket names that are empty, hidden or contain a separator.
pub(crate) fn check_bucket_name(name: &str) -> Result<(), Status> {
    if name.is_empty()
        || name.starts_with('.')
        || name.contains('/')
        || name.contains('\0')
        || name.len() > 222
    {
        return Err(Status::invalid_argument(format!(
            "invalid bucket name {name:?}: expected projects/_/buckets/NAME with a plain NAME"
        )));
    }
    Ok(())
}
