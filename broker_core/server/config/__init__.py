"""The broker's configuration: every key declared once (``broker_config`` lists them all;
the ACL, SASL, metrics endpoint, Kafka listener and commit-path timeout keys beside it),
docs generated from the declarations (docs/configuration.md)."""
