//! trainmem-alloc (being built).
