//! Generation and metageneration preconditions, checked against the live object the way
//! the service checks them.

use tonic::Status;

/// Generation and metageneration preconditions of a request.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Preconditions {
    /// The live generation must be this (0 = no live object).
    pub if_generation_match: Option<i64>,
    /// The live generation must not be this.
    pub if_generation_not_match: Option<i64>,
    /// The live metageneration must be this.
    pub if_metageneration_match: Option<i64>,
    /// The live metageneration must not be this.
    pub if_metageneration_not_match: Option<i64>,
}

impl Preconditions {
    /// Checks against the live object `(generation, metageneration)`, if any.
    pub fn check(&self, live: Option<(i64, i64)>) -> Result<(), Status> {
        let generation = live.map_or(0, |l| l.0);
        if let Some(want) = self.if_generation_match {
            if want != generation {
                return Err(Status::failed_precondition(format!(
                    "if_generation_match={want} failed: the live generation is {}",
                    describe(live)
                )));
            }
        }
        if let Some(not) = self.if_generation_not_match {
            if not == generation {
                return Err(Status::failed_precondition(format!(
                    "if_generation_not_match={not} failed: the live generation is {not}"
                )));
            }
        }
        if let Some(want) = self.if_metageneration_match {
            if live.map(|l| l.1) != Some(want) {
                return Err(Status::failed_precondition(format!(
                    "if_metageneration_match={want} failed: the object is at {}",
                    live.map_or("no object".to_string(), |l| format!(
                        "metageneration {}",
                        l.1
                    ))
                )));
            }
        }
        if let Some(not) = self.if_metageneration_not_match {
            if live.map(|l| l.1) == Some(not) {
                return Err(Status::failed_precondition(format!(
                    "if_metageneration_not_match={not} failed"
                )));
            }
        }
        Ok(())
    }
}

fn describe(live: Option<(i64, i64)>) -> String {
    live.map_or("none (no live object)".to_string(), |l| l.0.to_string())
}
