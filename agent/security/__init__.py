"""Who may call: TLS, credentials and tokens, the auth settings and throttle, and the
rule that a server beyond loopback needs them."""
