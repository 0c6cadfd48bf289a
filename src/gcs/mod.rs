//! The client side of the wire: channel and auth, bidi reader, appendable writer, unary calls
//! and the retry policy. Knows nothing of FUSE.
