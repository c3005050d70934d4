//! trainmem-burn (being built).
