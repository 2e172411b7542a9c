"""idemlog Spark side: the DataSource and the producer client (later issues)."""
