"""The reviewed training manifest: schema, secure read, secret scan, and verification."""
