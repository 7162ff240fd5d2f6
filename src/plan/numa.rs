//! `numa = "auto"`: which NUMA nodes each such tenant gets, from what the policy says it needs
//! (cpu.cores, memory.max) and what each node has (its cpus, its memory).
//!
//! Pure and deterministic: the same needs and nodes give the same placement. Rules, in order:
//! tenants pinned with `numa_nodes` take their nodes' capacity first; then the biggest tenant
//! first (memory, then cores, then name), each on one node when one fits it, preferring a node
//! no tenant uses yet (tenants that share nothing stay apart), then the node with the most free
//! memory; a tenant that no single node holds is spread over the fewest nodes (largest free
//! first). Cores count against a node's cpus (a quota of 2.5 cores takes 2.5 of them): the quota
//! is what the tenant may use, so nodes are not promised more than they can run. Huge pages
//! (`memory.huge_pages`) count against each node's huge page pools (nodeN/hugepages/*), which
//! other allocations cannot use: a node's memory is its MemTotal less its pools. The pools, not
//! their free pages, are the capacity: a running tenant's own pages are not free, and a plan
//! must not move it for holding them.
//!
//! Placement is sticky: a tenant already on nodes (`Need::current`, what its cpuset says now)
//! keeps the fewest of them that still hold it, before anyone is placed afresh, so a change of
//! one tenant's needs (seed 002's live swap of CPU counts) moves only the tenants that no longer
//! fit where they are; those grow from their own nodes first. Keeping never refuses a set that
//! fits: what a tenant takes is what it needs, so what is left over all nodes is the same, and
//! spreading uses whatever is left. The price: tenants that share a node keep sharing it.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::kernel::CpuSet;
use crate::units::HumanBytes;

/// What one tenant needs. A tenant without cpu.cores or memory.max needs none of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Need {
    pub tenant: String,
    pub cores: f64,
    pub memory: u64,
    /// Bytes of huge pages (`memory.huge_pages`).
    pub huge_pages: u64,
    /// `numa_nodes` set by the policy: the tenant is on these nodes, not placed.
    pub pinned: Option<CpuSet>,
    /// The nodes the tenant is on now (a part of the host's), kept while they hold it.
    pub current: Option<CpuSet>,
}

/// What one node offers (within what the parent cgroup allows).
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub id: u32,
    pub cpus: usize,
    /// `None` when the host does not say (no nodeN/meminfo): memory is then not a limit.
    pub memory: Option<u64>,
    /// Bytes in the node's huge page pools (0 without any).
    pub huge_pages: u64,
}

/// The nodes chosen for one `numa = "auto"` tenant and why (shown by `plan`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Choice {
    pub tenant: String,
    pub nodes: CpuSet,
    pub reason: String,
    /// The nodes it is on now (`Need::current`), when it was placed before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub was: Option<CpuSet>,
}

/// A tenant that does not fit: the message names it, what it needs and what each node has left.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub tenant: String,
    pub message: String,
}

#[derive(Clone)]
struct Free {
    cpus: f64,
    memory: Option<u64>,
    huge_pages: u64,
    users: Vec<String>,
}

impl Free {
    fn holds(&self, n: &Need) -> bool {
        self.cpus + 1e-9 >= n.cores
            && self.memory.is_none_or(|m| m >= n.memory)
            && self.huge_pages >= n.huge_pages
    }
    fn memory_left(&self) -> u64 {
        self.memory.unwrap_or(u64::MAX)
    }
}

fn needs_text(n: &Need) -> String {
    let unit = if n.cores == 1.0 { "core" } else { "cores" };
    let huge = if n.huge_pages > 0 {
        format!(" and {} of huge pages", HumanBytes(n.huge_pages))
    } else {
        String::new()
    };
    format!(
        "{} {unit} and {} of memory{huge}",
        n.cores,
        HumanBytes(n.memory)
    )
}

fn nodes_text(free: &BTreeMap<u32, Free>, nodes: &[Node]) -> String {
    nodes
        .iter()
        .map(|n| {
            let f = &free[&n.id];
            let mem = match (f.memory, n.memory) {
                (Some(left), Some(total)) => {
                    format!("{} of {} free", HumanBytes(left), HumanBytes(total))
                }
                _ => "memory unknown".into(),
            };
            let huge = if n.huge_pages > 0 {
                format!(
                    ", {} of {} of huge pages free",
                    HumanBytes(f.huge_pages),
                    HumanBytes(n.huge_pages)
                )
            } else {
                ", no huge pages".into()
            };
            format!(
                "node {}: {} of {} cpus free, {mem}{huge}",
                n.id, f.cpus, n.cpus
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Takes what `need` uses from the nodes `on`, filling each in order.
fn take(free: &mut BTreeMap<u32, Free>, on: &[u32], need: &Need) {
    let (mut cores, mut memory, mut huge) = (need.cores, need.memory, need.huge_pages);
    for id in on {
        let Some(f) = free.get_mut(id) else { continue };
        let h = huge.min(f.huge_pages);
        f.huge_pages -= h;
        huge -= h;
        let c = cores.min(f.cpus);
        f.cpus -= c;
        cores -= c;
        let m = memory.min(f.memory_left());
        if let Some(left) = &mut f.memory {
            *left -= m;
        }
        memory -= m;
        f.users.push(need.tenant.clone());
    }
}

/// Places the tenants without `pinned`; returns one choice per such tenant, in input order.
/// Tenants with `current` nodes keep what of them still holds them (see the module doc).
pub fn place(needs: &[Need], nodes: &[Node]) -> Result<Vec<Choice>, Refusal> {
    let mut free: BTreeMap<u32, Free> = nodes
        .iter()
        .map(|n| {
            (
                n.id,
                Free {
                    cpus: n.cpus as f64,
                    memory: n.memory,
                    huge_pages: n.huge_pages,
                    users: Vec::new(),
                },
            )
        })
        .collect();
    for n in needs {
        if let Some(p) = &n.pinned {
            let on: Vec<u32> = p.iter().collect();
            take(&mut free, &on, n);
        }
    }
    let mut order: Vec<&Need> = needs.iter().filter(|n| n.pinned.is_none()).collect();
    order.sort_by(|a, b| {
        b.memory
            .cmp(&a.memory)
            .then(b.cores.total_cmp(&a.cores))
            .then(a.tenant.cmp(&b.tenant))
    });
    let mut chosen: BTreeMap<&str, Choice> = BTreeMap::new();
    for need in &order {
        let Some(current) = need.current.clone() else {
            continue;
        };
        if let Some(on) = keep_within(&free, &current, need) {
            take(&mut free, &on, need);
            let set = CpuSet::from_iter(on);
            let reason = if set == current {
                format!(
                    "needs {}; stays on nodes {set}, which still hold it",
                    needs_text(need)
                )
            } else {
                format!(
                    "needs {}; keeps nodes {set} of its nodes {current}, which hold it",
                    needs_text(need)
                )
            };
            chosen.insert(
                &need.tenant,
                Choice {
                    tenant: need.tenant.clone(),
                    nodes: set,
                    reason,
                    was: Some(current),
                },
            );
        }
    }
    for need in order {
        if chosen.contains_key(need.tenant.as_str()) {
            continue;
        }
        let current = need.current.clone();
        // said when a tenant must leave (or grow beyond) the nodes it is on
        let moved = current
            .as_ref()
            .map(|c| format!("; its nodes {c} no longer hold it"))
            .unwrap_or_default();
        let fits_one = free
            .iter()
            .filter(|(_, f)| f.holds(need))
            .min_by(|(ia, a), (ib, b)| preferred((**ia, a), (**ib, b)))
            .map(|(id, f)| (*id, f.users.clone()));
        let choice = if let Some((id, users)) = fits_one {
            let reason = if users.is_empty() {
                format!(
                    "needs {}; node {id} holds it alone{moved}",
                    needs_text(need)
                )
            } else {
                format!(
                    "needs {}; no node is free of other tenants that holds it, node {id} has room beside {}{moved}",
                    needs_text(need),
                    users.join(", ")
                )
            };
            take(&mut free, &[id], need);
            Choice {
                tenant: need.tenant.clone(),
                nodes: CpuSet::from_iter([id]),
                reason,
                was: current,
            }
        } else {
            // the fewest nodes: largest free memory first, then most free cpus
            let mut by_size: Vec<(u32, Free)> = free.iter().map(|(i, f)| (*i, f.clone())).collect();
            by_size.sort_by(|(ia, a), (ib, b)| {
                // a tenant that needs huge pages goes where the pools are first
                let huge = |f: &Free| if need.huge_pages > 0 { f.huge_pages } else { 0 };
                // a tenant growing beyond its nodes keeps them and adds the fewest others
                let mine = |id: &u32, f: &Free| {
                    current.as_ref().is_some_and(|c| c.contains(*id))
                        && (f.cpus > 1e-9 || f.memory_left() > 0)
                };
                mine(ib, b)
                    .cmp(&mine(ia, a))
                    .then(huge(b).cmp(&huge(a)))
                    .then(b.memory_left().cmp(&a.memory_left()))
                    .then(b.cpus.total_cmp(&a.cpus))
                    .then(ia.cmp(ib))
            });
            let (mut cores, mut memory, mut huge, mut on) = (0.0, 0u64, 0u64, Vec::new());
            let enough = |cores: f64, memory: u64, huge: u64| {
                cores + 1e-9 >= need.cores && memory >= need.memory && huge >= need.huge_pages
            };
            for (id, f) in &by_size {
                if enough(cores, memory, huge) {
                    break;
                }
                cores += f.cpus;
                memory = memory.saturating_add(f.memory_left());
                huge = huge.saturating_add(f.huge_pages);
                on.push(*id);
            }
            if !enough(cores, memory, huge) {
                return Err(Refusal {
                    tenant: need.tenant.clone(),
                    message: format!(
                        "tenant `{}`: numa = \"auto\" cannot place it: it needs {}, and the nodes have (after the tenants placed before it) {}; lower its cpu.cores, memory.max or memory.huge_pages (or grow the nodes' huge page pools), or pin some tenants with numa_nodes",
                        need.tenant,
                        needs_text(need),
                        nodes_text(&free, nodes)
                    ),
                });
            }
            on.sort();
            take(&mut free, &on, need);
            let set = CpuSet::from_iter(on);
            Choice {
                tenant: need.tenant.clone(),
                reason: format!(
                    "needs {}; no single node holds it, nodes {set} are the fewest that do{}",
                    needs_text(need),
                    match &current {
                        Some(c) => format!(
                            "; its nodes {c} no longer hold it alone, so it keeps those with room and adds the fewest others"
                        ),
                        None => String::new(),
                    }
                ),
                nodes: set,
                was: current,
            }
        };
        chosen.insert(&need.tenant, choice);
    }
    Ok(needs
        .iter()
        .filter_map(|n| chosen.remove(n.tenant.as_str()))
        .collect())
}

/// Which of two nodes a tenant that fits on either goes to first: the one with fewer tenants,
/// then more memory left, more cpus free, the lower number.
fn preferred((ia, a): (u32, &Free), (ib, b): (u32, &Free)) -> std::cmp::Ordering {
    a.users
        .len()
        .cmp(&b.users.len())
        .then(b.memory_left().cmp(&a.memory_left()))
        .then(b.cpus.total_cmp(&a.cpus))
        .then(ia.cmp(&ib))
}

/// The nodes of `current` (the fewest) that hold `need` with what they have free, if any.
fn keep_within(free: &BTreeMap<u32, Free>, current: &CpuSet, need: &Need) -> Option<Vec<u32>> {
    let mine: Vec<(u32, &Free)> = free
        .iter()
        .filter(|(id, _)| current.contains(**id))
        .map(|(id, f)| (*id, f))
        .collect();
    if let Some((id, _)) = mine
        .iter()
        .filter(|(_, f)| f.holds(need))
        .min_by(|(ia, a), (ib, b)| preferred((*ia, a), (*ib, b)))
    {
        return Some(vec![*id]);
    }
    let mut by_size = mine;
    by_size.sort_by(|(ia, a), (ib, b)| {
        b.huge_pages
            .cmp(&a.huge_pages)
            .then(b.memory_left().cmp(&a.memory_left()))
            .then(b.cpus.total_cmp(&a.cpus))
            .then(ia.cmp(ib))
    });
    let (mut cores, mut memory, mut huge, mut on) = (0.0, 0u64, 0u64, Vec::new());
    for (id, f) in by_size {
        if cores + 1e-9 >= need.cores && memory >= need.memory && huge >= need.huge_pages {
            break;
        }
        cores += f.cpus;
        memory = memory.saturating_add(f.memory_left());
        huge = huge.saturating_add(f.huge_pages);
        on.push(id);
    }
    let enough = cores + 1e-9 >= need.cores && memory >= need.memory && huge >= need.huge_pages;
    (enough && !on.is_empty()).then(|| {
        on.sort();
        on
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GIB: u64 = 1 << 30;

    fn need(name: &str, cores: f64, gib: u64) -> Need {
        Need {
            tenant: name.into(),
            cores,
            memory: gib * GIB,
            huge_pages: 0,
            pinned: None,
            current: None,
        }
    }

    fn four_nodes() -> Vec<Node> {
        (0..4)
            .map(|id| Node {
                id,
                cpus: 1,
                memory: Some(4 * GIB),
                huge_pages: 0,
            })
            .collect()
    }

    fn nodes_of(c: &[Choice]) -> Vec<String> {
        c.iter().map(|c| c.nodes.to_string()).collect()
    }

    #[test]
    fn four_tenants_get_a_node_each() {
        let needs: Vec<Need> = (0..4).map(|i| need(&format!("db{i}"), 1.0, 3)).collect();
        let c = place(&needs, &four_nodes()).unwrap();
        assert_eq!(nodes_of(&c), ["0", "1", "2", "3"]);
        assert!(
            c[0].reason.contains("node 0 holds it alone"),
            "{}",
            c[0].reason
        );
    }

    #[test]
    fn a_tenant_too_big_for_one_node_spills_onto_two_and_the_rest_still_fit() {
        let needs = vec![
            need("small", 1.0, 2),
            need("big", 2.0, 6),
            need("other", 1.0, 3),
        ];
        let c = place(&needs, &four_nodes()).unwrap();
        assert_eq!(c[1].tenant, "big");
        assert_eq!(c[1].nodes.len(), 2, "{:?}", c);
        assert!(
            c[1].reason.contains("no single node holds it"),
            "{}",
            c[1].reason
        );
        // the others are each alone on a node the big one does not use
        for i in [0, 2] {
            assert_eq!(c[i].nodes.len(), 1);
            assert!(!c[i].nodes.is_subset(&c[1].nodes), "{:?}", c);
        }
        assert_ne!(c[0].nodes, c[2].nodes);
    }

    #[test]
    fn a_set_that_cannot_fit_is_refused_with_the_numbers() {
        let needs = vec![need("a", 1.0, 10), need("b", 1.0, 8)];
        let e = place(&needs, &four_nodes()).unwrap_err();
        assert_eq!(e.tenant, "b");
        for part in [
            "tenant `b`",
            "8GiB",
            "node 0:",
            "node 3:",
            "4GiB of 4GiB free",
        ] {
            assert!(e.message.contains(part), "{part} missing: {}", e.message);
        }
    }

    #[test]
    fn pinned_tenants_take_their_nodes_first() {
        let mut pinned = need("fixed", 1.0, 3);
        pinned.pinned = Some("0".parse().unwrap());
        let c = place(&[pinned, need("auto", 1.0, 3)], &four_nodes()).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].nodes.to_string(), "1");
    }

    #[test]
    fn when_nodes_run_out_tenants_share_and_say_with_whom() {
        let nodes = &four_nodes()[..2];
        let needs = vec![need("a", 0.5, 1), need("b", 0.5, 1), need("c", 0.0, 1)];
        let c = place(&needs, nodes).unwrap();
        assert!(c[2].reason.contains("beside"), "{}", c[2].reason);
    }

    #[test]
    fn unknown_node_memory_is_no_limit() {
        let nodes = vec![Node {
            id: 0,
            cpus: 2,
            memory: None,
            huge_pages: 0,
        }];
        let c = place(&[need("a", 2.0, 100)], &nodes).unwrap();
        assert_eq!(c[0].nodes.to_string(), "0");
    }

    #[test]
    fn huge_pages_go_where_the_pools_are() {
        // node 0 has no pool, node 1 one of 2 GiB, node 2 one of 1 GiB
        let mut nodes = four_nodes();
        nodes[1].huge_pages = 2 * GIB;
        nodes[2].huge_pages = GIB;
        let mut sga = need("sga", 1.0, 1);
        sga.huge_pages = 2 * GIB;
        let mut small = need("small", 1.0, 1);
        small.huge_pages = GIB;
        let c = place(&[sga.clone(), small, need("plain", 1.0, 1)], &nodes).unwrap();
        assert_eq!(nodes_of(&c), ["1", "2", "0"]);
        assert!(
            c[0].reason.contains("2GiB of huge pages"),
            "{}",
            c[0].reason
        );
        // more than one pool holds: spread over the pools; more than all hold: refused
        sga.huge_pages = 3 * GIB;
        let c = place(std::slice::from_ref(&sga), &nodes).unwrap();
        assert_eq!(nodes_of(&c), ["1-2"]);
        sga.huge_pages = 4 * GIB;
        let e = place(&[sga], &nodes).unwrap_err();
        for part in [
            "4GiB of huge pages",
            "node 0: 1 of 1 cpus free, 4GiB of 4GiB free, no huge pages",
            "node 1: 1 of 1 cpus free, 4GiB of 4GiB free, 2GiB of 2GiB of huge pages free",
            "memory.huge_pages",
        ] {
            assert!(e.message.contains(part), "{part}: {}", e.message);
        }
    }

    /// Seed 002's live swap: `a` goes from 2 cores to 1 and `b` from 1 to 2. Kept where they
    /// are, `a` keeps one of its two nodes, `b` keeps its own and adds the one `a` left, and `c`
    /// does not move; placed afresh, `a` and `b` would both leave all their nodes.
    #[test]
    fn a_live_swap_moves_only_the_tenants_that_must() {
        let on = |n: &str| Some(n.parse::<CpuSet>().unwrap());
        let mut a = need("a", 1.0, 1);
        a.current = on("0-1");
        let mut b = need("b", 2.0, 1);
        b.current = on("2");
        let mut c = need("c", 1.0, 1);
        c.current = on("3");
        let needs = vec![a, b, c];
        let kept = place(&needs, &four_nodes()).unwrap();
        assert_eq!(nodes_of(&kept), ["0", "1-2", "3"]);
        assert!(
            kept[0].reason.contains("keeps nodes 0 of its nodes 0-1"),
            "{}",
            kept[0].reason
        );
        assert!(
            kept[1]
                .reason
                .contains("its nodes 2 no longer hold it alone"),
            "{}",
            kept[1].reason
        );
        assert!(
            kept[2].reason.contains("stays on nodes 3"),
            "{}",
            kept[2].reason
        );
        let fresh: Vec<Need> = needs
            .iter()
            .map(|n| Need {
                current: None,
                ..n.clone()
            })
            .collect();
        assert_eq!(
            nodes_of(&place(&fresh, &four_nodes()).unwrap()),
            ["2", "0-1", "3"]
        );
        // and back: the same again from where the swap left them
        let mut back = needs.clone();
        back[0].cores = 2.0;
        back[0].current = on("0");
        back[1].cores = 1.0;
        back[1].current = on("1-2");
        // a grows from its node 0 into one b leaves (b keeps one of its two), c stays
        let again = place(&back, &four_nodes()).unwrap();
        assert_eq!(nodes_of(&again), ["0,2", "1", "3"]);
    }

    proptest! {
        /// Whatever the needs and wherever the tenants are now: deterministic, in input order,
        /// each tenant within its nodes' capacity, and refused exactly when the set is larger
        /// than the host (keeping tenants where they are never refuses a set that fits).
        #[test]
        fn placements_respect_capacity(
            needs in proptest::collection::vec((0u32..4, 0u64..9, 0u32..16), 1..7),
            node_gib in proptest::collection::vec(1u64..9, 1..5),
        ) {
            // the bit mask of the nodes each tenant is on now (none: not placed yet)
            let needs: Vec<Need> = needs.iter().enumerate()
                .map(|(i, (c, g, on))| Need {
                    current: Some((0..node_gib.len() as u32).filter(|n| on & (1 << n) != 0).collect::<CpuSet>())
                        .filter(|s| !s.is_empty()),
                    ..need(&format!("t{i}"), *c as f64, *g)
                }).collect();
            let nodes: Vec<Node> = node_gib.iter().enumerate()
                .map(|(i, g)| Node { id: i as u32, cpus: 4, memory: Some(g * GIB), huge_pages: 0 }).collect();
            let first = place(&needs, &nodes);
            prop_assert_eq!(&first, &place(&needs, &nodes));
            // spreading fills whatever is left, so a set is refused exactly when it is larger
            // than the host
            let total_mem: u64 = nodes.iter().map(|n| n.memory.unwrap()).sum();
            let need_mem: u64 = needs.iter().map(|n| n.memory).sum();
            let need_cores: f64 = needs.iter().map(|n| n.cores).sum();
            let too_big = need_mem > total_mem || need_cores > 4.0 * nodes.len() as f64;
            prop_assert_eq!(first.is_err(), too_big, "{:?}", first);
            if let Ok(choices) = first {
                prop_assert_eq!(choices.len(), needs.len());
                // tenants alone on one node never exceed it together
                let mut used: BTreeMap<u32, (f64, u64)> = BTreeMap::new();
                for (c, n) in choices.iter().zip(&needs) {
                    prop_assert_eq!(&c.tenant, &n.tenant);
                    let cap_mem: u64 = c.nodes.iter().map(|i| nodes[i as usize].memory.unwrap()).sum();
                    prop_assert!(cap_mem >= n.memory, "{:?} on {}", n, c.nodes);
                    if c.nodes.len() == 1 {
                        let u = used.entry(c.nodes.iter().next().unwrap()).or_default();
                        u.0 += n.cores;
                        u.1 += n.memory;
                    }
                }
                for (i, (cores, mem)) in used {
                    prop_assert!(cores <= 4.0 + 1e-9 && mem <= nodes[i as usize].memory.unwrap());
                }
            }
        }
    }
}
