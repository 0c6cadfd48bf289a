//! The only module that knows fuser: decode kernel requests, call `fs`, reply.
