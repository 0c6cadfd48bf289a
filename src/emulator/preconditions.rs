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

/// The `Preconditions` of request `$r`, whose four `if_*` fields have the usual names
/// (GetObject, DeleteObject, UpdateObject, a read or write spec, MoveObject's destination).
macro_rules! preconditions_of {
    ($r:expr) => {
        $crate::emulator::preconditions::Preconditions {
            if_generation_match: $r.if_generation_match,
            if_generation_not_match: $r.if_generation_not_match,
            if_metageneration_match: $r.if_metageneration_match,
            if_metageneration_not_match: $r.if_metageneration_not_match,
        }
    };
}
pub(crate) use preconditions_of;

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
        // The service documents this one as failing when there is no live object at all.
        if let Some(not) = self.if_generation_not_match {
            if live.is_none() || not == generation {
                return Err(Status::failed_precondition(format!(
                    "if_generation_not_match={not} failed: the live generation is {}",
                    describe(live)
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

#[cfg(test)]
mod tests {
    use super::Preconditions;

    #[test]
    fn if_generation_not_match_needs_a_live_object() {
        let not_5 = Preconditions {
            if_generation_not_match: Some(5),
            ..Preconditions::default()
        };
        assert!(not_5.check(Some((6, 1))).is_ok());
        assert!(not_5.check(Some((5, 1))).is_err());
        assert!(not_5.check(None).is_err(), "no live object fails it");
        let not_0 = Preconditions {
            if_generation_not_match: Some(0),
            ..Preconditions::default()
        };
        assert!(not_0.check(Some((6, 1))).is_ok());
        assert!(not_0.check(None).is_err());
    }
}
