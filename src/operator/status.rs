//! Status conditions as Kubernetes users read them: a transition time that moves only
//! when the status does, and a `state` summing them up.

use api::operator::Observed;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

pub const RECONCILED: &str = "Reconciled";
pub const READY: &str = "Ready";
pub const IN_USE: &str = "InUse";

/// One condition observed now; `merge` keeps the old transition time if nothing changed.
pub fn condition(type_: &str, ok: bool, reason: &str, message: impl Into<String>) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: Time(Timestamp::now()),
        observed_generation: None,
    }
}

/// `new` with each condition's transition time taken from `old` when its status is the
/// same, and `generation` as the generation they describe.
pub fn merge(old: &[Condition], new: Vec<Condition>, generation: Option<i64>) -> Vec<Condition> {
    new.into_iter()
        .map(|mut c| {
            if let Some(prev) = get(old, &c.type_)
                && prev.status == c.status
            {
                c.last_transition_time = prev.last_transition_time.clone();
            }
            c.observed_generation = generation;
            c
        })
        .collect()
}

/// The status block every kind reports: `conditions` over `old`'s (see [`merge`]), the
/// generation they describe, and the state they sum up to.
pub fn observed(old: &Observed, conditions: Vec<Condition>, generation: Option<i64>) -> Observed {
    let conditions = merge(&old.conditions, conditions, generation);
    Observed {
        observed_generation: generation,
        state: Some(state(&conditions)),
        conditions,
    }
}

pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    get(conditions, type_).is_some_and(|c| c.status == "True")
}

/// `Healthy`, or the reason of the first condition that is not True (`InUse` aside: not
/// being used is no fault).
pub fn state(conditions: &[Condition]) -> String {
    (conditions.iter())
        .find(|c| c.type_ != IN_USE && c.status != "True")
        .map_or_else(|| "Healthy".into(), |c| c.reason.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transition_time_moves_only_with_the_status() {
        let mut old = condition(READY, false, "NotReady", "");
        old.last_transition_time = Time(Timestamp::UNIX_EPOCH);
        let same = merge(
            std::slice::from_ref(&old),
            vec![condition(READY, false, "NotReady", "")],
            Some(2),
        );
        assert_eq!(same[0].last_transition_time.0, Timestamp::UNIX_EPOCH);
        assert_eq!(same[0].observed_generation, Some(2));
        let moved = merge(&[old], vec![condition(READY, true, "Ready", "")], None);
        assert!(moved[0].last_transition_time.0 > Timestamp::UNIX_EPOCH);
    }

    #[test]
    fn the_state_is_the_first_failing_reason_not_counting_use() {
        let ready = condition(READY, true, "Ready", "");
        let unused = condition(IN_USE, false, "NotInUse", "");
        assert_eq!(state(&[ready.clone(), unused.clone()]), "Healthy");
        let failed = condition(RECONCILED, false, "InvalidMeshConfig", "");
        assert_eq!(state(&[ready, unused, failed]), "InvalidMeshConfig");
    }
}
