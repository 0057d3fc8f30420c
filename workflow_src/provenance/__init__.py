"""Provenance: hashes, atomic writes, environment fingerprint, manifests."""
