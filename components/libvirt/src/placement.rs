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
//! A pool's placement request (contract 0.2.0) narrows the candidates first ([`spread`]): the
//! connections its siblings use are left out, unless that leaves none, where a `required` request
//! makes nothing and a preferred one takes any.
//!
//! The rule only chooses; `create` then checks the chosen pool's space exactly, after the base
//! image is there (its size sets the disk's when `diskGiB` is smaller or unset).
//!
//! What a VM needs is what its new volumes allocate now, not the disk's virtual size
//! ([`disk_needs`]): a copy-on-write disk starts as a qcow2 header and tables of about 1 MiB, a
//! whole copy as large as the base's data (qemu-img copies no unallocated cluster).

use crate::config::{DiskMode, Placement};

/// One GiB.
const GIB: u64 = 1 << 30;

/// What a new qcow2 overlay allocates before the guest writes, at most, besides its L1 table:
/// the header, the refcount table and block, and libvirt's preallocated metadata (about 200 KiB
/// measured on libvirt 9.0; rounded up).
const OVERLAY_BYTES: u64 = 1 << 20;

/// The guest-visible bytes one L1 table entry maps (64 KiB clusters of 8-byte L2 entries).
const L1_ENTRY_MAPS: u64 = 512 << 20;

/// The sizes of the base image in a pool, when it holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BaseSize {
    /// Its virtual size.
    pub capacity: u64,
    /// What its data takes in the pool.
    pub allocation: u64,
}

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

/// What a new qcow2 overlay of `capacity` bytes allocates: [`OVERLAY_BYTES`] and its L1 table.
pub fn overlay_bytes(capacity: u64) -> u64 {
    OVERLAY_BYTES.saturating_add(capacity.div_ceil(L1_ENTRY_MAPS).saturating_mul(8))
}

/// What making a disk of `capacity` bytes allocates in the pool: its overlay when backed by the
/// base; for a whole copy, the base's data and the temporary overlay it is copied from.
pub fn disk_needs(mode: DiskMode, capacity: u64, base_allocation: u64) -> u64 {
    match mode {
        DiskMode::CopyOnWrite => overlay_bytes(capacity),
        DiskMode::FullCopy => base_allocation.saturating_add(overlay_bytes(capacity)),
    }
}

/// What a new disk and seed need in a pool: exact when the pool holds the base image (`base`), a
/// lower bound otherwise (the base's size is known only once imported, and its own import is not
/// counted), so `firstWithRoom` never passes over a pool that has room.
pub fn needed(
    mode: DiskMode,
    disk_gib: Option<u64>,
    base: Option<BaseSize>,
    seed_bytes: u64,
) -> u64 {
    let (capacity, allocation) = base.map_or((0, 0), |base| (base.capacity, base.allocation));
    disk_needs(mode, disk_capacity(disk_gib, capacity), allocation).saturating_add(seed_bytes)
}

/// The candidates a placement request leaves: those not on an avoided connection; every one when
/// the request is only preferred and avoids them all; `Err` naming the shortage when it is
/// required and avoids them all. A connection that holds the VM's volume stays: the cut attempt
/// already placed it there.
pub fn spread<'a>(
    avoid: &[String],
    required: bool,
    candidates: Vec<Candidate<'a>>,
) -> Result<Vec<Candidate<'a>>, String> {
    let avoided = |c: &Candidate<'_>| !c.holds_our_volume && avoid.iter().any(|a| a == c.name);
    if candidates.iter().any(|c| !avoided(c)) {
        return Ok(candidates.into_iter().filter(|c| !avoided(c)).collect());
    }
    if !required || candidates.is_empty() {
        return Ok(candidates);
    }
    let names: Vec<_> = candidates.iter().map(|c| c.name).collect();
    Err(format!(
        "placement: every connection that answered ({}) already runs a sibling, and the spread \
         is required: another hypervisor is needed",
        names.join(", ")
    ))
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
    fn a_placement_request_leaves_out_the_avoided_connections() {
        let names = |kept: Vec<Candidate<'static>>| kept.iter().map(|c| c.name).collect::<Vec<_>>();
        let avoid = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let three = || candidates(&[(5, false, 1), (9, false, 1), (7, false, 1)]);
        assert_eq!(
            names(spread(&avoid(&["hv1"]), true, three()).unwrap()),
            ["hv0", "hv2"]
        );
        assert_eq!(
            names(spread(&[], true, three()).unwrap()),
            ["hv0", "hv1", "hv2"]
        );
        // Every one avoided: preferred takes any, required makes nothing and names them.
        let all = avoid(&["hv0", "hv1", "hv2"]);
        assert_eq!(names(spread(&all, false, three()).unwrap()).len(), 3);
        let shortage = spread(&all, true, three()).unwrap_err();
        assert!(shortage.contains("hv0, hv1, hv2"), "{shortage}");
        // A cut attempt's volume keeps its connection, avoided or not.
        let cut = candidates(&[(5, false, 1), (9, true, 1)]);
        assert_eq!(
            names(spread(&avoid(&["hv1"]), true, cut).unwrap()),
            ["hv0", "hv1"]
        );
    }

    /// What a VM needs is what its volumes allocate now: a copy-on-write disk's overlay (1 MiB
    /// and 8 bytes per 512 MiB of disk), a whole copy's data and temporary overlay, and the seed;
    /// never the virtual size of a disk that starts near-empty.
    #[test]
    fn what_a_vm_needs_is_what_its_disk_and_seed_allocate() {
        use DiskMode::{CopyOnWrite as Cow, FullCopy as Full};
        const MIB: u64 = 1 << 20;
        let base = |capacity, allocation| {
            Some(BaseSize {
                capacity,
                allocation,
            })
        };
        let rows = [
            // (mode, diskGiB, base in the pool, seed bytes) → bytes
            ((Cow, None, None, 400), MIB + 400),
            ((Cow, None, base(GIB, 300 * MIB), 400), MIB + 16 + 400),
            ((Cow, Some(10), None, 400), MIB + 160 + 400),
            ((Cow, Some(65536), base(GIB, GIB), 0), 2 * MIB),
            ((Full, None, None, 400), MIB + 400),
            (
                (Full, None, base(GIB, 300 * MIB), 400),
                301 * MIB + 16 + 400,
            ),
            (
                (Full, Some(10), base(3 * GIB, 2 * GIB), 0),
                2 * GIB + MIB + 160,
            ),
            ((Full, Some(u64::MAX), base(GIB, u64::MAX), 400), u64::MAX),
        ];
        for ((mode, disk_gib, base, seed), want) in rows {
            assert_eq!(
                needed(mode, disk_gib, base, seed),
                want,
                "{mode:?} {disk_gib:?} {base:?}"
            );
        }
        assert_eq!(disk_capacity(Some(2), GIB), 2 * GIB);
        assert_eq!(disk_capacity(Some(1), 3 * GIB), 3 * GIB);
    }
}
