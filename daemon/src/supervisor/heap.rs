//! Giving freed memory back to the system.
//!
//! glibc's malloc raises its mmap threshold each time a large mmapped block is freed (up to
//! 32 MiB): after the first model unload, buffers of a later load come from the heap instead,
//! and an unload leaves them as holes the heap keeps. Measured with `kazeia soak`: RSS crept up
//! ~12 MiB per unload/reload of SmolLM2. A fixed threshold keeps large buffers in their own
//! mappings (returned at free), and a trim after an unload returns the heap's free tail.
//! Android's allocator (scudo) returns large blocks by itself: nothing to do there.

/// Fix malloc's mmap threshold at 1 MiB (setting it turns off the dynamic adjustment).
pub fn fix_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// Return free heap memory to the system (after an unload).
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        libc::malloc_trim(0);
    }
}
