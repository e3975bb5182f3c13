//! Batch heuristics for a set of waiting jobs (Vasques' Table 4; Braun et al.): Min-min,
//! Max-min and Sufferage over the broker's predicted completion times, pure (no I/O, no clock).
//!
//! The model is the heuristics' ETC model (Vasques, Appendix A eq. 3): each resource is a
//! machine that runs the batch's jobs one after another. A [`Cell`] per (job, resource) holds
//! the broker's prediction for the job alone: `start_s` (stage-in plus the load-based wait, or
//! a reservation's start) and `run_s` (execution plus stage-out, i.e. completion − start); `None`
//! when the resource is not a candidate (requirements, staleness, the policy's filter). Once
//! jobs are assigned to a resource, a job there starts at `max(start_s, completion of the
//! resource's previous job)`. A job placed first therefore completes exactly at the broker's
//! predicted completion (`gma broker select` ranks by the same number).
//!
//! Each round computes, for every unassigned job, its earliest completion over the resources
//! (ties: the lower resource index) and then maps one job:
//! - **Min-min**: the job with the smallest earliest completion;
//! - **Max-min**: the job with the largest earliest completion;
//! - **Sufferage**: the job with the largest sufferage = second-earliest − earliest completion
//!   (a job with one candidate suffers infinitely: it goes first); this is the one-job-per-round
//!   form (Vasques' "assign first the task that would suffer most"), not Maheswaran's variant
//!   that maps several jobs per pass.
//!
//! Job ties break by the lower job index: the result is deterministic. `O(s² m)` for s jobs on
//! m resources. A job with no candidate is reported, never assigned.

use std::path::Path;

use serde::Deserialize;

use crate::job::{load_toml, parse_toml, validate_jobs, validated, Job, JobError};

/// Most jobs in one batch.
pub const MAX_BATCH_JOBS: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heuristic {
    MinMin,
    MaxMin,
    Sufferage,
}

impl Heuristic {
    pub fn parse(s: &str) -> Option<Heuristic> {
        Some(match s {
            "min-min" => Heuristic::MinMin,
            "max-min" => Heuristic::MaxMin,
            "sufferage" => Heuristic::Sufferage,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Heuristic::MinMin => "min-min",
            Heuristic::MaxMin => "max-min",
            Heuristic::Sufferage => "sufferage",
        }
    }
}

/// The broker's prediction for one job on one resource, alone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cell {
    pub start_s: f64,
    pub run_s: f64,
}

/// One job mapped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Assignment {
    pub job: usize,
    pub resource: usize,
    pub start_s: f64,
    pub completion_s: f64,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Schedule {
    /// In the order the heuristic mapped them.
    pub assignments: Vec<Assignment>,
    /// Latest completion of the assigned jobs (0 when none).
    pub makespan_s: f64,
    /// Jobs without a candidate resource.
    pub unplaceable: Vec<usize>,
}

/// A matrix `cells[job][resource]` that [`schedule`] cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MatrixError {
    #[error("job {job}: {got} resources, the first job has {first}")]
    Ragged { job: usize, got: usize, first: usize },
    #[error("job {job} on resource {resource}: times must be finite and >= 0")]
    BadTime { job: usize, resource: usize },
}

/// Checks a matrix `cells[job][resource]`: rows of equal length, times finite and >= 0.
pub fn check(cells: &[Vec<Option<Cell>>]) -> Result<(), MatrixError> {
    let m = cells.first().map_or(0, Vec::len);
    for (j, row) in cells.iter().enumerate() {
        if row.len() != m {
            return Err(MatrixError::Ragged {
                job: j,
                got: row.len(),
                first: m,
            });
        }
        for (r, c) in row.iter().enumerate() {
            if let Some(c) = c {
                if !(c.start_s.is_finite() && c.start_s >= 0.0 && c.run_s.is_finite() && c.run_s >= 0.0) {
                    return Err(MatrixError::BadTime { job: j, resource: r });
                }
            }
        }
    }
    Ok(())
}

/// Maps every job with a candidate (see the module doc). `cells` must pass [`check`].
pub fn schedule(cells: &[Vec<Option<Cell>>], h: Heuristic) -> Schedule {
    let m = cells.first().map_or(0, Vec::len);
    let mut free_at = vec![0.0f64; m];
    let mut out = Schedule::default();
    let mut left: Vec<usize> = Vec::new();
    for (j, row) in cells.iter().enumerate() {
        if row.iter().any(Option::is_some) {
            left.push(j);
        } else {
            out.unplaceable.push(j);
        }
    }
    while !left.is_empty() {
        // (position in `left`, key, resource, start, completion); a larger key wins.
        let mut pick: Option<(usize, f64, usize, f64, f64)> = None;
        for (pos, &j) in left.iter().enumerate() {
            let mut best: Option<(usize, f64, f64)> = None;
            let mut second = f64::INFINITY;
            for (r, c) in cells[j].iter().enumerate() {
                let Some(c) = c else { continue };
                let start = c.start_s.max(free_at[r]);
                let done = start + c.run_s;
                match best {
                    Some((_, _, b)) if done >= b => second = second.min(done),
                    _ => {
                        if let Some((_, _, b)) = best {
                            second = second.min(b);
                        }
                        best = Some((r, start, done));
                    }
                }
            }
            let Some((r, start, done)) = best else { continue };
            let key = match h {
                Heuristic::MinMin => -done,
                Heuristic::MaxMin => done,
                Heuristic::Sufferage => second - done,
            };
            if pick.is_none_or(|p| key > p.1) {
                pick = Some((pos, key, r, start, done));
            }
        }
        let Some((pos, _, r, start, done)) = pick else {
            break;
        };
        let j = left.remove(pos);
        free_at[r] = done;
        out.makespan_s = out.makespan_s.max(done);
        out.assignments.push(Assignment {
            job: j,
            resource: r,
            start_s: start,
            completion_s: done,
        });
    }
    out
}

/// The matrix from the broker's rankings, one per job: `(resource, predicted start,
/// predicted completion)`. Resources are the union, sorted by name.
pub fn matrix(per_job: &[Vec<(String, f64, f64)>]) -> (Vec<String>, Vec<Vec<Option<Cell>>>) {
    let mut names: Vec<String> = per_job.iter().flatten().map(|(n, _, _)| n.clone()).collect();
    names.sort();
    names.dedup();
    let cells = per_job
        .iter()
        .map(|ranked| {
            let mut row = vec![None; names.len()];
            for (n, start, done) in ranked {
                if let Ok(i) = names.binary_search(n) {
                    let ok = start.is_finite() && done.is_finite() && *start >= 0.0 && done >= start;
                    if ok {
                        row[i] = Some(Cell {
                            start_s: *start,
                            run_s: done - start,
                        });
                    }
                }
            }
            row
        })
        .collect();
    (names, cells)
}

/// `gma broker select --batch FILE`: `[[job]]` tables, each a job as in the one-job file.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct BatchFile {
    #[serde(default)]
    pub job: Vec<Job>,
}

impl BatchFile {
    pub fn load(path: &Path) -> Result<BatchFile, JobError> {
        validated(load_toml(path)?, BatchFile::validate)
    }

    pub fn from_toml(text: &str, origin: &str) -> Result<BatchFile, JobError> {
        validated(parse_toml(text, origin)?, BatchFile::validate)
    }

    pub fn validate(&self) -> Result<(), JobError> {
        validate_jobs(&self.job, MAX_BATCH_JOBS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn etc(rows: &[&[f64]]) -> Vec<Vec<Option<Cell>>> {
        rows.iter()
            .map(|r| {
                r.iter()
                    .map(|&run_s| (run_s.is_finite()).then_some(Cell { start_s: 0.0, run_s }))
                    .collect()
            })
            .collect()
    }

    fn mapped(s: &Schedule) -> Vec<(usize, usize, f64)> {
        s.assignments
            .iter()
            .map(|a| (a.job, a.resource, a.completion_s))
            .collect()
    }

    /// Worked by hand (3 jobs, 2 machines, all ready at 0):
    /// ETC = J0 [4, 6], J1 [3, 10], J2 [5, 6].
    /// - Min-min: J1→m0 (3); J0: m0 7, m1 6 and J2: m0 8, m1 6 tie at 6 → J0→m1 (6); J2: m0 8,
    ///   m1 12 → m0 (8). Makespan 8.
    /// - Max-min: minima 4, 3, 5 → J2→m0 (5); J0: 9 / 6 → 6, J1: 8 / 10 → 8 → J1→m0 (8);
    ///   J0→m1 (6). Makespan 8.
    /// - Sufferage: sufferages 2, 7, 1 → J1→m0 (3); J0: m0 7, m1 6 → 1; J2: m0 8, m1 6 → 2 →
    ///   J2→m1 (6); J0: m0 7, m1 12 → m0 (7). Makespan 7: the job that suffers most (J1 has
    ///   only one good machine) goes first.
    #[test]
    fn the_worked_example() {
        let m = etc(&[&[4.0, 6.0], &[3.0, 10.0], &[5.0, 6.0]]);
        let s = schedule(&m, Heuristic::MinMin);
        assert_eq!(mapped(&s), [(1, 0, 3.0), (0, 1, 6.0), (2, 0, 8.0)]);
        assert_eq!(s.makespan_s, 8.0);
        let s = schedule(&m, Heuristic::MaxMin);
        assert_eq!(mapped(&s), [(2, 0, 5.0), (1, 0, 8.0), (0, 1, 6.0)]);
        assert_eq!(s.makespan_s, 8.0);
        let s = schedule(&m, Heuristic::Sufferage);
        assert_eq!(mapped(&s), [(1, 0, 3.0), (2, 1, 6.0), (0, 0, 7.0)]);
        assert_eq!(s.makespan_s, 7.0);
        // The second job on m0 in Sufferage starts when J1 ends.
        assert_eq!(s.assignments[2].start_s, 3.0);
    }

    #[test]
    fn predicted_starts_count_and_jobs_without_a_candidate_are_reported() {
        // m0 busy for 10 s by load (the broker's wait), m1 free but slower.
        let m = vec![
            vec![
                Some(Cell {
                    start_s: 10.0,
                    run_s: 2.0,
                }),
                Some(Cell {
                    start_s: 0.0,
                    run_s: 5.0,
                }),
            ],
            vec![None, None],
            vec![
                None,
                Some(Cell {
                    start_s: 0.0,
                    run_s: 1.0,
                }),
            ],
        ];
        check(&m).unwrap();
        let s = schedule(&m, Heuristic::MinMin);
        assert_eq!(s.unplaceable, [1]);
        assert_eq!(mapped(&s), [(2, 1, 1.0), (0, 1, 6.0)]);
        assert_eq!(s.assignments[1].start_s, 1.0);
        // Sufferage: job 2 has one candidate (infinite sufferage) and goes first as well.
        assert_eq!(mapped(&schedule(&m, Heuristic::Sufferage))[0], (2, 1, 1.0));
        let ragged = check(&[vec![None], vec![None, None]]).unwrap_err();
        assert_eq!(ragged.to_string(), "job 1: 2 resources, the first job has 1");
        let nan = check(&[vec![Some(Cell {
            start_s: f64::NAN,
            run_s: 1.0,
        })]])
        .unwrap_err();
        assert_eq!(nan, MatrixError::BadTime { job: 0, resource: 0 });
    }

    #[test]
    fn the_matrix_from_rankings_and_the_batch_file() {
        let (names, m) = matrix(&[
            vec![("b".into(), 0.0, 10.0), ("a".into(), 5.0, 7.0)],
            vec![("c".into(), 1.0, 2.0), ("a".into(), f64::NAN, 1.0)],
        ]);
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(
            m[0][0],
            Some(Cell {
                start_s: 5.0,
                run_s: 2.0
            })
        );
        assert_eq!(m[0][2], None);
        assert_eq!(m[1][0], None, "a non-finite prediction is no candidate");
        let f = BatchFile::from_toml(
            "[[job]]\nname = \"a\"\ncpus = 1\nreference_time_s = 60\n[[job]]\nname = \"b\"\ncpus = 2\nreference_time_s = 30\n",
            "t",
        )
        .unwrap();
        assert_eq!(f.job.len(), 2);
        let e =
            BatchFile::from_toml("[[job]]\nname = \"a\"\ncpus = 0\nreference_time_s = 1\n", "t").unwrap_err();
        assert_eq!(e.to_string(), "job[0].cpus: must be at least 1");
        let e = BatchFile::from_toml("", "t").unwrap_err();
        assert!(e.to_string().contains("at least one [[job]]"), "{e}");
        let twice = "[[job]]\nname = \"a\"\ncpus = 1\nreference_time_s = 1\n";
        let e = BatchFile::from_toml(&format!("{twice}{twice}"), "t").unwrap_err();
        assert!(e.to_string().contains("job[1].name"), "{e}");
        assert_eq!(Heuristic::parse("sufferage"), Some(Heuristic::Sufferage));
        assert_eq!(Heuristic::parse("min-max"), None);
    }

    /// 1..8 jobs × 1..5 resources, each cell absent with probability 1/5.
    fn matrices() -> impl Strategy<Value = Vec<Vec<Option<Cell>>>> {
        (1..8usize, 1..5usize).prop_flat_map(|(n, m)| {
            prop::collection::vec(
                prop::collection::vec(
                    prop::option::weighted(
                        0.8,
                        (0.0..100.0f64, 0.0..100.0f64).prop_map(|(start_s, run_s)| Cell { start_s, run_s }),
                    ),
                    m,
                ),
                n,
            )
        })
    }

    fn heuristics() -> impl Strategy<Value = Heuristic> {
        prop::sample::select(vec![Heuristic::MinMin, Heuristic::MaxMin, Heuristic::Sufferage])
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]
        #[test]
        fn every_job_with_a_candidate_is_assigned_exactly_once_on_a_candidate(m in matrices(), h in heuristics()) {
            let s = schedule(&m, h);
            let mut seen = vec![0u32; m.len()];
            for a in &s.assignments {
                seen[a.job] += 1;
                let c = m[a.job][a.resource];
                prop_assert!(c.is_some(), "assigned to a non-candidate");
                let c = c.unwrap();
                prop_assert!(a.start_s >= c.start_s && (a.completion_s - a.start_s - c.run_s).abs() < 1e-9);
            }
            for (j, row) in m.iter().enumerate() {
                let placeable = row.iter().any(Option::is_some);
                prop_assert_eq!(seen[j], u32::from(placeable), "job {}", j);
                prop_assert_eq!(s.unplaceable.contains(&j), !placeable);
            }
            // Jobs on one resource never overlap, in the order they were mapped.
            for r in 0..m.first().map_or(0, Vec::len) {
                let on: Vec<_> = s.assignments.iter().filter(|a| a.resource == r).collect();
                for w in on.windows(2) {
                    prop_assert!(w[1].start_s >= w[0].completion_s - 1e-9);
                }
            }
            let max = s.assignments.iter().map(|a| a.completion_s).fold(0.0, f64::max);
            prop_assert_eq!(s.makespan_s, max);
        }

        #[test]
        fn min_min_first_picks_the_global_minimum_completion(m in matrices()) {
            let global = m
                .iter()
                .flatten()
                .flatten()
                .map(|c| c.start_s + c.run_s)
                .fold(f64::INFINITY, f64::min);
            let s = schedule(&m, Heuristic::MinMin);
            if let Some(first) = s.assignments.first() {
                prop_assert_eq!(first.completion_s, global);
            } else {
                prop_assert!(global.is_infinite());
            }
            // Max-min's first pick is the largest of the jobs' minima.
            let largest_min = m
                .iter()
                .filter_map(|row| {
                    row.iter()
                        .flatten()
                        .map(|c| c.start_s + c.run_s)
                        .reduce(f64::min)
                })
                .fold(f64::NEG_INFINITY, f64::max);
            if let Some(first) = schedule(&m, Heuristic::MaxMin).assignments.first() {
                prop_assert_eq!(first.completion_s, largest_min);
            }
        }
    }
}
