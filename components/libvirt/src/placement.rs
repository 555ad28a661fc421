//! Which connection a new VM goes to: pure, table-tested.
//!
//! `create` asks this only once no connection has a domain with the VM's name. In order:
//!
//! 1. The first connection (in list order) whose pool holds the VM's disk or seed: a cut attempt
//!    chose it, and going elsewhere would leave a second disk or seed behind.
//! 2. `mostAvailable`: the pool with the most available bytes; ties go to the first in list order.
//! 3. `firstWithRoom`: the first in list order whose pool's available bytes cover what the VM
//!    needs there ([`needed`]); none → `None` (`quota-exceeded`).
//!
//! The rule only chooses; `create` then checks the chosen pool's space exactly, after the base
//! image is there (its size sets the disk's when `diskGiB` is smaller or unset).

use crate::config::Placement;

/// One GiB.
const GIB: u64 = 1 << 30;

/// One connection as placement sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate<'a> {
    /// The connection's name (for messages).
    pub name: &'a str,
    /// The pool's available bytes.
    pub available: u64,
    /// Whether the pool already holds this VM's disk or seed.
    pub holds_our_volume: bool,
    /// What the VM needs in this pool, at least ([`needed`]).
    pub needed: u64,
}

/// The disk's size: `diskGiB`, never smaller than the base image.
pub fn disk_capacity(disk_gib: Option<u64>, base_capacity: u64) -> u64 {
    disk_gib
        .map_or(0, |gib| gib.saturating_mul(GIB))
        .max(base_capacity)
}

/// What a new disk and seed need in a pool: exact when the pool holds the base image
/// (`base_capacity`), a lower bound otherwise (the base's size is known only once imported), so
/// `firstWithRoom` never passes over a pool that has room.
pub fn needed(disk_gib: Option<u64>, base_capacity: Option<u64>, seed_bytes: u64) -> u64 {
    disk_capacity(disk_gib, base_capacity.unwrap_or(0)).saturating_add(seed_bytes)
}

/// The index of the chosen candidate; `None` when `firstWithRoom` finds no room (or there is no
/// candidate).
pub fn choose(rule: Placement, candidates: &[Candidate<'_>]) -> Option<usize> {
    if let Some(index) = candidates.iter().position(|c| c.holds_our_volume) {
        return Some(index);
    }
    match rule {
        // `max_by_key` keeps the last of equals: fold keeps the first.
        Placement::MostAvailable => candidates
            .iter()
            .enumerate()
            .fold(None, |best: Option<(usize, u64)>, (index, c)| match best {
                Some((_, most)) if most >= c.available => best,
                _ => Some((index, c.available)),
            })
            .map(|(index, _)| index),
        Placement::FirstWithRoom => candidates.iter().position(|c| c.available >= c.needed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(available, holds_our_volume, needed)` per connection, named `hv0`, `hv1`, … in order.
    type Row = (u64, bool, u64);

    fn candidates(rows: &[Row]) -> Vec<Candidate<'static>> {
        const NAMES: [&str; 4] = ["hv0", "hv1", "hv2", "hv3"];
        rows.iter()
            .zip(NAMES)
            .map(|(&(available, holds_our_volume, needed), name)| Candidate {
                name,
                available,
                holds_our_volume,
                needed,
            })
            .collect()
    }

    #[test]
    fn placement_table() {
        use Placement::{FirstWithRoom as First, MostAvailable as Most};
        let rows: [(Placement, &[Row], Option<usize>); 14] = [
            (Most, &[], None),
            (First, &[], None),
            (Most, &[(5, false, 1)], Some(0)),
            (
                Most,
                &[(5, false, 1), (9, false, 1), (7, false, 1)],
                Some(1),
            ),
            // Ties go to list order.
            (Most, &[(9, false, 1), (9, false, 1)], Some(0)),
            (
                Most,
                &[(3, false, 1), (9, false, 1), (9, false, 1)],
                Some(1),
            ),
            // The most available even without room: create's exact check answers quota-exceeded.
            (Most, &[(0, false, 5), (2, false, 5)], Some(1)),
            (
                First,
                &[(5, false, 6), (6, false, 6), (100, false, 6)],
                Some(1),
            ),
            (First, &[(5, false, 6), (5, false, 6)], None),
            // A volume left by a cut attempt wins over space, under either rule.
            (Most, &[(100, false, 1), (1, true, 1)], Some(1)),
            (First, &[(100, false, 1), (0, true, 9)], Some(1)),
            (First, &[(0, false, 9), (0, true, 9), (0, true, 9)], Some(1)),
            // Needs differ per pool (one holds the base, so its need is exact).
            (First, &[(10, false, 20), (10, false, 8)], Some(1)),
            (
                Most,
                &[(0, false, 0), (0, false, 0), (1, false, 0)],
                Some(2),
            ),
        ];
        for (rule, rows, want) in rows {
            assert_eq!(choose(rule, &candidates(rows)), want, "{rule:?} {rows:?}");
        }
    }

    #[test]
    fn what_a_vm_needs_is_its_disk_and_seed() {
        let rows = [
            // (diskGiB, base capacity in the pool, seed bytes) → bytes
            ((None, None, 400), 400),
            ((None, Some(GIB), 400), GIB + 400),
            ((Some(10), None, 400), 10 * GIB + 400),
            ((Some(1), Some(3 * GIB), 0), 3 * GIB),
            ((Some(u64::MAX), None, 400), u64::MAX),
        ];
        for ((disk_gib, base, seed), want) in rows {
            assert_eq!(needed(disk_gib, base, seed), want, "{disk_gib:?} {base:?}");
        }
        assert_eq!(disk_capacity(Some(2), GIB), 2 * GIB);
    }
}
