//! The thread count chosen before the kernels' first use (its own process: the pool is global).

#[test]
fn the_thread_count_is_set_once_before_the_pool_starts() {
    assert_eq!(spec_kernels::set_threads(1), Ok(()));
    assert_eq!(spec_kernels::threads(), 1);
    assert_eq!(spec_kernels::set_threads(2), Err(1));
    let mut out = vec![0f32; 10];
    spec_kernels::parallel_chunks_mut(&mut out, 3, &|index, chunk| chunk.fill(index as f32));
    assert_eq!(out, [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 3.0]);
}
