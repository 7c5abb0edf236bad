"""One module per verb group of the `ito` client; each exposes `register(subparsers)`."""
