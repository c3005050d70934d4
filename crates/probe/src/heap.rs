//! Keeping freed heap memory in the process instead of handing it back to the OS.
//!
//! glibc's `malloc` gives the free top of its heap back to the OS once it exceeds the trim
//! threshold, and serves requests above the mmap threshold with mappings of their own that
//! are unmapped when freed. Both thresholds adapt as the program frees large blocks, up to
//! 32 MiB (mmap) and 64 MiB (trim) on 64-bit systems. A program that builds and frees a large
//! structure again and again (trainmem's simulator holds about 95 MB at 8,000 layers, and
//! `trainmem fit` runs it many times per question) then gives its whole heap back at the end
//! of every run and faults every page in again at the next: at 8,000 layers about 7,500 page
//! faults per simulation, against 1,400 at 4,000 layers whose heap stays under the threshold.
//!
//! [`retain_freed_heap`] raises the trim threshold to [`TRIM_THRESHOLD`] and fixes the mmap
//! threshold at [`MMAP_THRESHOLD`] (the value the adaptive one reaches), so that freed memory
//! stays in the heap for the next run. It is a setting of the whole process: call it from a
//! binary, for the commands that repeat large computations, not from a library, and not in a
//! process whose resident memory is being measured (freed memory stays resident).
//!
//! The thresholds govern the heap of the main thread (glibc's main arena), where trainmem's
//! simulations run. Other threads allocate from arenas made of 64 MiB heaps, and glibc unmaps
//! such a heap whenever all of it is free, whatever the trim threshold.

/// Free bytes at the heap's top that [`retain_freed_heap`] lets glibc keep (1 GiB).
pub const TRIM_THRESHOLD: usize = 1 << 30;

/// Requests at least this large still get a mapping of their own (32 MiB, glibc's largest
/// adaptive mmap threshold on 64-bit systems).
pub const MMAP_THRESHOLD: usize = 32 << 20;

/// Keeps memory the process frees in its heap, for reuse, instead of returning it to the OS
/// (see the module docs). Returns `true` when the C library took the setting: on Linux with
/// glibc; elsewhere it does nothing and returns `false`.
pub fn retain_freed_heap() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const _: () = assert!(TRIM_THRESHOLD <= i32::MAX as usize);
        const _: () = assert!(MMAP_THRESHOLD <= i32::MAX as usize);
        // SAFETY: `mallopt` only changes glibc's malloc parameters; it takes plain integers,
        // touches no memory of the caller's, and is safe to call from any thread at any time
        // (glibc takes its own arena lock). It returns 1 on success, 0 on failure. Both values
        // fit a C `int` (checked above).
        let (t, m) = unsafe {
            (
                libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD as i32),
                libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as i32),
            )
        };
        t == 1 && m == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
