"""This member of its mesh: its keypair and host fingerprint (``identity``), joining,
leaving and forgetting (``join``, ``departure``, ``ephemeral``), rotating its key or local
token, the archive and keyring of its old keys, and the record that it was revoked."""
