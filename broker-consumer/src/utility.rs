//! Partial requirement satisfaction (Vasques, notes/utility-and-provisioning.md §1.4).
//!
//! Each requirement maps an attribute of a resource (or of the prediction for it) through a
//! user-defined step function: the first interval `[min, max)` that holds the value gives its
//! utility in `[0, 1]`; a value in no interval (or unknown, NaN) gives 0. The per-requirement
//! utilities are combined by the user's class:
//!
//! | class      | `and`                         | `or`                                   |
//! |------------|-------------------------------|----------------------------------------|
//! | `guest`    | weighted mean                 | max                                    |
//! | `other_vo` | product                       | max                                    |
//! | `local`    | minimum                       | max                                    |
//! | `admin`    | 1 if every requirement is fully met (utility 1), else 0 | the first requirement in file order with a non-zero utility |
//!
//! The paper leaves the weights open: here they are the requirements' `weight`s normalized to
//! sum 1 (all 0 = equal weights). For utilities in `[0, 1]`: product ≤ min ≤ weighted mean ≤ max.

use gma_core::Refuse;
use serde::Deserialize;

use crate::error::Error;

/// Attributes a requirement may name (besides `bench_<name>`).
pub const ATTRIBUTES: [&str; 9] = [
    "free_cpus",
    "cpus",
    "memory_mb",
    "load1",
    "queue_waiting",
    "start_s",
    "completion_s",
    "exec_s",
    "cost",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UserClass {
    #[default]
    Guest,
    OtherVo,
    Local,
    Admin,
}

impl UserClass {
    pub fn parse(s: &str) -> Option<UserClass> {
        Some(match s {
            "" | "guest" => UserClass::Guest,
            "other_vo" => UserClass::OtherVo,
            "local" => UserClass::Local,
            "admin" => UserClass::Admin,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            UserClass::Guest => "guest",
            UserClass::OtherVo => "other_vo",
            UserClass::Local => "local",
            UserClass::Admin => "admin",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operator {
    #[default]
    And,
    Or,
}

impl Operator {
    pub fn parse(s: &str) -> Option<Operator> {
        Some(match s {
            "" | "and" => Operator::And,
            "or" => Operator::Or,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Operator::And => "and",
            Operator::Or => "or",
        }
    }
}

/// `[min, max)` → `utility`; a missing bound is open.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Interval {
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub utility: f64,
}

impl Interval {
    pub fn contains(&self, v: f64) -> bool {
        self.min.is_none_or(|m| v >= m) && self.max.is_none_or(|m| v < m)
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Requirement {
    pub attribute: String,
    pub intervals: Vec<Interval>,
    #[serde(default)]
    pub weight: f64,
}

impl Requirement {
    /// The partial utility of `value`: the first interval holding it, else 0 (NaN: 0).
    pub fn partial(&self, value: f64) -> f64 {
        if value.is_nan() {
            return 0.0;
        }
        self.intervals
            .iter()
            .find(|i| i.contains(value))
            .map_or(0.0, |i| i.utility)
    }

    /// Why this requirement is malformed, if it is (`at` names it in the message).
    pub fn check(&self, at: &str) -> Result<(), Error> {
        let known = ATTRIBUTES.contains(&self.attribute.as_str())
            || self
                .attribute
                .strip_prefix("bench_")
                .is_some_and(|b| !b.is_empty());
        if !known {
            return Err(Error::invalid_argument(format!(
                "{at}.attribute: unknown attribute {:?} (one of {}, bench_<name>)",
                gma_core::clip(&self.attribute, 64),
                ATTRIBUTES.join(", ")
            )));
        }
        if self.intervals.is_empty() {
            return Err(Error::invalid_argument(format!(
                "{at}.intervals: give at least one interval"
            )));
        }
        if self.intervals.len() > 64 {
            return Err(Error::invalid_argument(format!(
                "{at}.intervals: at most 64 intervals"
            )));
        }
        if !self.weight.is_finite() || self.weight < 0.0 {
            return Err(Error::invalid_argument(format!(
                "{at}.weight: must be a finite number >= 0"
            )));
        }
        for (k, i) in self.intervals.iter().enumerate() {
            if !(0.0..=1.0).contains(&i.utility) {
                return Err(Error::invalid_argument(format!(
                    "{at}.intervals[{k}].utility: must be within 0..=1"
                )));
            }
            let bad = |b: Option<f64>| b.is_some_and(|v| v.is_nan());
            if bad(i.min) || bad(i.max) {
                return Err(Error::invalid_argument(format!(
                    "{at}.intervals[{k}]: bounds must be numbers"
                )));
            }
            if let (Some(lo), Some(hi)) = (i.min, i.max) {
                if lo >= hi {
                    return Err(Error::invalid_argument(format!(
                        "{at}.intervals[{k}]: min must be below max"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Combines per-requirement utilities `partials` (in file order, with their `weights`).
pub fn combine(class: UserClass, op: Operator, partials: &[f64], weights: &[f64]) -> f64 {
    if partials.is_empty() {
        return 1.0;
    }
    match (op, class) {
        (Operator::Or, UserClass::Admin) => partials.iter().copied().find(|u| *u > 0.0).unwrap_or(0.0),
        (Operator::Or, _) => partials.iter().copied().fold(0.0, f64::max),
        (Operator::And, UserClass::Guest) => {
            let total: f64 = weights.iter().sum();
            if total > 0.0 {
                partials.iter().zip(weights).map(|(u, w)| u * w).sum::<f64>() / total
            } else {
                partials.iter().sum::<f64>() / partials.len() as f64
            }
        }
        (Operator::And, UserClass::OtherVo) => partials.iter().product(),
        (Operator::And, UserClass::Local) => partials.iter().copied().fold(1.0, f64::min),
        (Operator::And, UserClass::Admin) => {
            if partials.iter().all(|u| *u >= 1.0) {
                1.0
            } else {
                0.0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn req(intervals: &[(Option<f64>, Option<f64>, f64)]) -> Requirement {
        Requirement {
            attribute: "free_cpus".into(),
            intervals: intervals
                .iter()
                .map(|&(min, max, utility)| Interval { min, max, utility })
                .collect(),
            weight: 0.0,
        }
    }

    #[test]
    fn step_functions_take_the_first_interval_and_half_open_bounds() {
        let r = req(&[(Some(4.0), None, 1.0), (Some(2.0), Some(4.0), 0.5)]);
        assert_eq!(r.partial(8.0), 1.0);
        assert_eq!(r.partial(4.0), 1.0, "min is inclusive");
        assert_eq!(r.partial(3.999), 0.5);
        assert_eq!(r.partial(2.0), 0.5);
        assert_eq!(r.partial(1.999), 0.0, "outside every interval");
        assert_eq!(r.partial(f64::NAN), 0.0, "unknown");
        let r = req(&[(None, Some(10.0), 0.3)]);
        assert_eq!(r.partial(9.999), 0.3);
        assert_eq!(r.partial(10.0), 0.0, "max is exclusive");
    }

    #[test]
    fn the_golden_example_of_the_four_classes() {
        let u = [1.0, 0.5, 0.8];
        let w = [0.5, 0.25, 0.25];
        let and = |c| combine(c, Operator::And, &u, &w);
        assert!((and(UserClass::Guest) - 0.825).abs() < 1e-12);
        assert!((and(UserClass::OtherVo) - 0.4).abs() < 1e-12);
        assert!((and(UserClass::Local) - 0.5).abs() < 1e-12);
        assert_eq!(and(UserClass::Admin), 0.0);
        assert_eq!(
            combine(UserClass::Admin, Operator::And, &[1.0, 1.0], &[0.0, 0.0]),
            1.0
        );
        assert_eq!(combine(UserClass::Guest, Operator::Or, &u, &w), 1.0);
        assert_eq!(combine(UserClass::Admin, Operator::Or, &[0.0, 0.5, 0.8], &w), 0.5);
        // No weights: equal weights.
        assert!((combine(UserClass::Guest, Operator::And, &u, &[0.0; 3]) - 2.3 / 3.0).abs() < 1e-12);
    }

    /// 1 to 5 (utility, weight) pairs: utilities in [0, 1], weights in [0, 1).
    fn utilities_and_weights() -> impl Strategy<Value = (Vec<f64>, Vec<f64>)> {
        (1..6usize).prop_flat_map(|n| {
            (
                prop::collection::vec(0.0..=1.0f64, n),
                prop::collection::vec(0.0..1.0f64, n),
            )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn product_min_mean_max_are_ordered_for_random_utilities((u, w) in utilities_and_weights()) {
            let p = combine(UserClass::OtherVo, Operator::And, &u, &w);
            let m = combine(UserClass::Local, Operator::And, &u, &w);
            let g = combine(UserClass::Guest, Operator::And, &u, &w);
            let x = combine(UserClass::Local, Operator::Or, &u, &w);
            prop_assert!(p <= m + 1e-12 && m <= g + 1e-12 && g <= x + 1e-12, "{} {} {} {}", p, m, g, x);
        }
    }

    #[test]
    fn malformed_requirements_name_the_field() {
        let mut r = req(&[(Some(4.0), Some(2.0), 1.0)]);
        assert!(r
            .check("utility[0]")
            .unwrap_err()
            .to_string()
            .contains("utility[0].intervals[0]: min must be below max"));
        r = req(&[(None, None, 1.5)]);
        assert!(r
            .check("u")
            .unwrap_err()
            .to_string()
            .contains("u.intervals[0].utility"));
        r.attribute = "colour".into();
        assert!(r
            .check("u")
            .unwrap_err()
            .to_string()
            .contains("unknown attribute \"colour\""));
        r = req(&[]);
        assert!(r
            .check("u")
            .unwrap_err()
            .to_string()
            .contains("at least one interval"));
        r = req(&[(None, None, 1.0)]);
        r.attribute = "bench_specfp".into();
        assert!(r.check("u").is_ok());
    }
}
