//! Reading the kernel's files is all syscalls and shares nothing between items, so readers of
//! many items (tenants, processes, hierarchies) split them over two threads: on these 2-core
//! hosts that halves the wall time of a scan, a `status` or an `apply` at 1,000 tenants.

/// `read` over `items`, in two threads (one for each half, results in order) once there are
/// `at_least` of them; below that, here.
pub fn in_two<T: Sync, R: Send>(
    items: &[T],
    at_least: usize,
    read: impl Fn(&[T]) -> Vec<R> + Sync,
) -> Vec<R> {
    if items.len() < at_least.max(2) {
        return read(items);
    }
    let (first, second) = items.split_at(items.len().div_ceil(2));
    std::thread::scope(|s| {
        let other = s.spawn(|| read(second));
        let mut out = read(first);
        out.extend(other.join().expect("reader thread"));
        out
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn results_keep_the_items_order_whether_split_or_not() {
        let items: Vec<u32> = (0..9).collect();
        let double = |part: &[u32]| part.iter().map(|i| i * 2).collect::<Vec<_>>();
        let want: Vec<u32> = (0..9).map(|i| i * 2).collect();
        assert_eq!(super::in_two(&items, 4, double), want);
        assert_eq!(super::in_two(&items, 100, double), want);
        assert_eq!(super::in_two(&items[..1], 0, double), vec![0]);
        assert!(super::in_two(&items[..0], 0, double).is_empty());
    }
}
