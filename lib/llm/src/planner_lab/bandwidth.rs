//! How KV transfers under way share the replicas' links: each replica sends on one link
//! and receives on another, each of the engine's `kv_transfer_gbps`, and the transfers
//! crossing a link split it max-min fairly (progressive filling: the link whose equal
//! share is smallest fixes the rate of its transfers, whose use is taken off their other
//! link, until every transfer has a rate).

use std::collections::BTreeMap;

/// One end of a transfer: `(sends, replica id)`.
type Link = (bool, u64);

/// The rate of each transfer `(from, to)` (replica ids) in `flows`, each link carrying
/// at most `capacity` (any unit); a transfer alone gets `capacity`.
pub(crate) fn fair_rates(flows: &[(u64, u64)], capacity: f64) -> Vec<f64> {
    let links = |&(from, to): &(u64, u64)| [(true, from), (false, to)];
    let mut left: BTreeMap<Link, f64> = flows.iter().flat_map(links).map(|l| (l, capacity)).collect();
    let mut rates: Vec<Option<f64>> = vec![None; flows.len()];
    loop {
        let mut crossing: BTreeMap<Link, usize> = BTreeMap::new();
        for (flow, _) in flows.iter().zip(&rates).filter(|(_, r)| r.is_none()) {
            for link in links(flow) {
                *crossing.entry(link).or_default() += 1;
            }
        }
        let Some((bottleneck, share)) = crossing
            .iter()
            .map(|(link, &n)| (*link, left[link].max(0.0) / n as f64))
            .min_by(|a, b| a.1.total_cmp(&b.1))
        else {
            break;
        };
        for (k, flow) in flows.iter().enumerate() {
            if rates[k].is_none() && links(flow).contains(&bottleneck) {
                rates[k] = Some(share);
                for link in links(flow) {
                    if let Some(l) = left.get_mut(&link) {
                        *l -= share;
                    }
                }
            }
        }
    }
    rates.into_iter().map(|r| r.unwrap_or(capacity)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_transfer_has_the_whole_link_and_a_shared_link_is_split_max_min_fairly() {
        assert_eq!(fair_rates(&[(0, 1)], 6.0), vec![6.0]);
        assert!(fair_rates(&[], 6.0).is_empty());
        // Two into one decode replica: half each.
        assert_eq!(fair_rates(&[(0, 2), (1, 2)], 6.0), vec![3.0, 3.0]);
        // Three into replica 10 get a third each; replica 2's other transfer, to replica
        // 11, takes what its send link has left.
        assert_eq!(fair_rates(&[(0, 10), (1, 10), (2, 10), (2, 11)], 6.0), vec![2.0, 2.0, 2.0, 4.0]);
        // Disjoint links do not interfere.
        assert_eq!(fair_rates(&[(0, 10), (1, 11)], 6.0), vec![6.0, 6.0]);
    }
}
