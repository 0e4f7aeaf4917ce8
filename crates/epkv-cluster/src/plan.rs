//! A rebalance's target map (issue 15's first part): from the current map and the nodes
//! that are to hold vBuckets, the map to move to.
//!
//! What it guarantees ([`target_chains`]):
//! - every chain has `replicas + 1` slots, its first `min(replicas + 1, nodes)` filled
//!   with distinct nodes of the given set (no two copies of a vBucket on one node), the
//!   rest empty;
//! - each rank (the actives, the first replicas, ...) is balanced: every node holds the
//!   same number of that rank's copies, within one;
//! - few moves: a copy stays where it is when that keeps the rank balanced, and a copy
//!   that must be placed goes first to a node already holding another copy of that
//!   vBucket (a promotion, or a demotion: a state change, no data moved). A map that is
//!   already balanced over the same nodes is returned unchanged.
//!
//! How: rank by rank, each node gets a quota (the vBucket count divided among the nodes,
//! the remainder to the nodes that hold most of that rank already); copies are kept
//! where their node has quota left, then the rest placed on a node with quota left
//! outside the chain, preferring one that holds a copy of that vBucket, then the one with
//! the most quota left. When only nodes already in the chain have quota left, a vBucket
//! placed earlier at that rank trades its node with it.
//!
//! Server groups are left out, as the issue allows.

use crate::doc::Chains;
use std::collections::BTreeMap;

/// The balanced map over `nodes` (node indexes; duplicates ignored) closest to `current`.
/// An empty `nodes` gives chains of empty slots.
#[must_use]
pub fn target_chains(current: &Chains, nodes: &[usize], replicas: usize) -> Chains {
    let mut nodes: Vec<usize> = nodes.to_vec();
    nodes.sort_unstable();
    nodes.dedup();
    let width = replicas + 1;
    let copies = width.min(nodes.len());
    let sets = node_sets(current, &nodes, copies);
    let mut target = ranks(current, &sets, &nodes, width, copies);
    rebalance_ranks(&mut target, &nodes, copies);
    target
}

/// Which nodes hold each vBucket's copies (as sets): each node holds its share of all
/// the copies, within one (the remainder to the nodes holding most now); a copy stays
/// where it is while its node's share allows, so the copies placed (the moves) are the
/// fewest a balanced map needs. The rest go to the nodes with the most share left.
fn node_sets(current: &Chains, nodes: &[usize], copies: usize) -> Vec<Vec<usize>> {
    let mut sets: Vec<Vec<usize>> = vec![Vec::with_capacity(copies); current.len()];
    if copies == 0 {
        return sets;
    }
    let held = |n: usize| current.iter().filter(|c| c.contains(&Some(n))).count();
    let mut quota = share(current.len() * copies, nodes, held);
    for (v, chain) in current.iter().enumerate() {
        for n in chain.iter().flatten() {
            if sets[v].len() < copies
                && !sets[v].contains(n)
                && quota.get(n).is_some_and(|q| *q > 0)
            {
                sets[v].push(*n);
                *quota.entry(*n).or_default() -= 1;
            }
        }
    }
    for v in 0..current.len() {
        while sets[v].len() < copies {
            let choice = quota
                .iter()
                .filter(|(n, q)| **q > 0 && !sets[v].contains(n))
                .max_by_key(|(n, q)| (**q, std::cmp::Reverse(**n)))
                .map(|(n, _)| *n);
            let n = match choice {
                Some(n) => {
                    *quota.entry(n).or_default() -= 1;
                    n
                }
                None => trade(&mut sets, &mut quota, nodes, v),
            };
            sets[v].push(n);
        }
    }
    sets
}

/// `total` divided among `nodes`, within one; the remainder to the nodes `held` says
/// hold the most.
fn share(total: usize, nodes: &[usize], held: impl Fn(usize) -> usize) -> BTreeMap<usize, usize> {
    let base = total / nodes.len();
    let extra = total % nodes.len();
    let mut by_held: Vec<(usize, usize)> = nodes.iter().map(|&n| (n, held(n))).collect();
    by_held.sort_by_key(|&(n, h)| (std::cmp::Reverse(h), n));
    by_held
        .iter()
        .enumerate()
        .map(|(i, &(n, _))| (n, base + usize::from(i < extra)))
        .collect()
}

/// vBucket `v` needs a node and every node with share left is already in its set: a
/// vBucket `w` holding a node `m` outside `v`'s set and lacking a node `q` with share left
/// takes `q` instead (spending its share), and `m` is returned for `v`. Should none
/// exist, `v` gets the node outside its set holding the fewest copies.
fn trade(
    sets: &mut [Vec<usize>],
    quota: &mut BTreeMap<usize, usize>,
    nodes: &[usize],
    v: usize,
) -> usize {
    let open: Vec<usize> = quota
        .iter()
        .filter(|(_, q)| **q > 0)
        .map(|(n, _)| *n)
        .collect();
    for w in 0..sets.len() {
        if w == v {
            continue;
        }
        let Some(i) = sets[w].iter().position(|m| !sets[v].contains(m)) else {
            continue;
        };
        if let Some(&q) = open.iter().find(|q| !sets[w].contains(q)) {
            let m = std::mem::replace(&mut sets[w][i], q);
            *quota.entry(q).or_default() -= 1;
            return m;
        }
    }
    let held = |n: usize| sets.iter().filter(|s| s.contains(&n)).count();
    nodes
        .iter()
        .copied()
        .filter(|n| !sets[v].contains(n))
        .min_by_key(|n| (held(*n), *n))
        .unwrap_or(nodes[0])
}

/// Orders each vBucket's set into its chain: a node keeps its rank where that rank's
/// share allows (an active stays active), the others take the free ranks, the node with
/// the most share left at that rank first. No copy moves between nodes here.
fn ranks(
    current: &Chains,
    sets: &[Vec<usize>],
    nodes: &[usize],
    width: usize,
    copies: usize,
) -> Chains {
    let mut target: Chains = vec![vec![None; width]; current.len()];
    let mut quota: Vec<BTreeMap<usize, usize>> = (0..copies)
        .map(|r| {
            share(current.len(), nodes, |n| {
                current.iter().filter(|c| c.get(r) == Some(&Some(n))).count()
            })
        })
        .collect();
    for (v, set) in sets.iter().enumerate() {
        for (r, q) in quota.iter_mut().enumerate() {
            if let Some(Some(n)) = current[v].get(r)
                && set.contains(n)
                && q.get(n).is_some_and(|left| *left > 0)
            {
                target[v][r] = Some(*n);
                *q.entry(*n).or_default() -= 1;
            }
        }
    }
    for (v, set) in sets.iter().enumerate() {
        for r in 0..copies {
            if target[v][r].is_some() {
                continue;
            }
            let n = set
                .iter()
                .copied()
                .filter(|n| !target[v].contains(&Some(*n)))
                .max_by_key(|n| (quota[r].get(n).copied().unwrap_or(0), std::cmp::Reverse(*n)));
            if let Some(n) = n {
                target[v][r] = Some(n);
                if let Some(left) = quota[r].get_mut(&n) {
                    *left = left.saturating_sub(1);
                }
            }
        }
    }
    target
}

/// Evens out a rank the placement left unbalanced (it happens when every node is in every
/// chain, so the last ranks are forced): a copy on a node holding too many of its rank
/// trades ranks, within its chain, with a copy on a node holding too few, preferring a
/// trade that evens out the other rank too. Bounded; each trade keeps every chain's nodes.
fn rebalance_ranks(target: &mut Chains, nodes: &[usize], copies: usize) {
    // counts[r][i]: copies of rank r on nodes[i].
    let index: BTreeMap<usize, usize> = nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let mut counts = vec![vec![0usize; nodes.len()]; copies];
    for chain in target.iter() {
        for (r, n) in chain.iter().take(copies).enumerate() {
            if let Some(i) = n.and_then(|n| index.get(&n).copied()) {
                counts[r][i] += 1;
            }
        }
    }
    for _ in 0..4 * target.len() * copies.max(1) {
        // The first unbalanced rank: its fullest and emptiest nodes.
        let worst = (0..copies).find_map(|r| {
            let (hi, a) = counts[r].iter().enumerate().map(|(i, c)| (*c, i)).max()?;
            let (lo, b) = counts[r].iter().enumerate().map(|(i, c)| (*c, i)).min()?;
            (hi > lo + 1).then_some((r, a, b))
        });
        let Some((r, ai, bi)) = worst else { return };
        let (a, b) = (Some(nodes[ai]), Some(nodes[bi]));
        // A chain holding `a` at rank `r` and `b` at another rank `t`: swap them. Best
        // when that evens out rank `t` too (`b` has more there than `a`).
        let mut best: Option<(usize, usize, bool)> = None;
        for (w, chain) in target.iter().enumerate() {
            if chain[r] != a {
                continue;
            }
            if let Some(t) = chain.iter().take(copies).position(|n| *n == b) {
                let evens = counts[t][bi] > counts[t][ai];
                if best.is_none_or(|(_, _, e)| evens && !e) {
                    best = Some((w, t, evens));
                }
                if evens {
                    break;
                }
            }
        }
        match best {
            Some((w, t, _)) => {
                target[w].swap(r, t);
                counts[r][ai] -= 1;
                counts[r][bi] += 1;
                counts[t][bi] -= 1;
                counts[t][ai] += 1;
            }
            None => {
                // No chain holds both: move one copy from `a` to `b` (a chain holding
                // `a` at rank `r` and not `b`).
                let Some(w) = target.iter().position(|c| c[r] == a && !c.contains(&b)) else {
                    return;
                };
                target[w][r] = b;
                counts[r][ai] -= 1;
                counts[r][bi] += 1;
            }
        }
    }
}


/// Copies placed on a node that held no copy of that vBucket before: the data a
/// rebalance from `current` to `target` streams.
#[must_use]
pub fn moves(current: &Chains, target: &Chains) -> usize {
    target
        .iter()
        .zip(current)
        .map(|(t, c)| {
            t.iter()
                .flatten()
                .filter(|n| !c.contains(&Some(**n)))
                .count()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use epkv_types::NUM_VBUCKETS;
    use proptest::prelude::*;

    const V: usize = NUM_VBUCKETS as usize;

    /// The file's map: vBucket `v`'s `i`th copy on node `(v + i) mod n`.
    fn formula(n: usize, replicas: usize) -> Chains {
        (0..V)
            .map(|v| {
                (0..=replicas)
                    .map(|i| (i < n).then_some((v + i) % n))
                    .collect()
            })
            .collect()
    }

    /// Checks the target's guarantees; returns the problem, if any.
    fn check(target: &Chains, nodes: &[usize], replicas: usize) -> Result<(), String> {
        let copies = (replicas + 1).min(nodes.len());
        for (v, chain) in target.iter().enumerate() {
            if chain.len() != replicas + 1 {
                return Err(format!("vb {v}: {} slots", chain.len()));
            }
            let filled: Vec<usize> = chain.iter().take(copies).flatten().copied().collect();
            if filled.len() != copies || chain.iter().skip(copies).any(Option::is_some) {
                return Err(format!("vb {v}: {chain:?}"));
            }
            if filled.iter().any(|n| !nodes.contains(n)) {
                return Err(format!("vb {v}: a node outside {nodes:?}: {chain:?}"));
            }
            let mut sorted = filled.clone();
            sorted.sort_unstable();
            sorted.dedup();
            if sorted.len() != filled.len() {
                return Err(format!("vb {v}: two copies on one node: {chain:?}"));
            }
        }
        for rank in 0..copies {
            let counts: Vec<usize> = nodes
                .iter()
                .map(|n| target.iter().filter(|c| c[rank] == Some(*n)).count())
                .collect();
            let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            if hi - lo > 1 {
                return Err(format!("rank {rank} unbalanced: {counts:?}"));
            }
        }
        Ok(())
    }

    /// The fewest moves any balanced target needs: what each node must gain in copies.
    fn least_moves(current: &Chains, target: &Chains, nodes: &[usize]) -> usize {
        nodes
            .iter()
            .map(|n| {
                let count = |m: &Chains| {
                    m.iter().filter(|c| c.contains(&Some(*n))).count()
                };
                count(target).saturating_sub(count(current))
            })
            .sum()
    }

    #[test]
    fn a_balanced_map_over_the_same_nodes_is_kept() {
        for n in 1..=8 {
            for r in 0..=3 {
                let nodes: Vec<usize> = (0..n).collect();
                let current = formula(n, r);
                let target = target_chains(&current, &nodes, r);
                check(&target, &nodes, r).unwrap();
                assert_eq!(target, current, "{n} nodes, {r} replicas");
                assert_eq!(moves(&current, &target), 0);
            }
        }
    }

    #[test]
    fn adding_or_removing_a_node_moves_little_more_than_it_must() {
        for n in 1..=7 {
            for r in 0..=3 {
                let current = formula(n, r);
                for nodes in [(0..=n).collect::<Vec<_>>(), (1..n).collect()] {
                    if nodes.is_empty() {
                        continue;
                    }
                    let target = target_chains(&current, &nodes, r);
                    check(&target, &nodes, r).unwrap();
                    let (made, least) = (moves(&current, &target), least_moves(&current, &target, &nodes));
                    assert!(
                        made <= least + least / 4 + 8,
                        "{n} nodes -> {nodes:?}, {r} replicas: {made} moves, at least {least}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_swap_moves_only_the_leaving_nodes_copies() {
        // Node 3 replaces node 0 in a three-node cluster with one replica.
        let current = formula(3, 1);
        let target = target_chains(&current, &[1, 2, 3], 1);
        check(&target, &[1, 2, 3], 1).unwrap();
        let held_by_0 = current.iter().filter(|c| c.contains(&Some(0))).count();
        assert!(moves(&current, &target) <= held_by_0 + held_by_0 / 4, "{}", moves(&current, &target));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn any_map_becomes_a_valid_balanced_one(
            seed in proptest::collection::vec(proptest::option::of(0usize..10), V * 4),
            pick in proptest::collection::btree_set(0usize..10, 1..=8),
            replicas in 0usize..=3,
        ) {
            let current: Chains = seed
                .chunks(4)
                .map(|c| c[..=replicas].to_vec())
                .collect();
            let nodes: Vec<usize> = pick.into_iter().collect();
            let target = target_chains(&current, &nodes, replicas);
            prop_assert_eq!(check(&target, &nodes, replicas), Ok(()));
            // Planning again from the target changes nothing.
            prop_assert_eq!(&target_chains(&target, &nodes, replicas), &target);
        }
    }
}
