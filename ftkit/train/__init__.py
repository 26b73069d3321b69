"""Training: config, driver, cells, rank worker, micro-shards, exact reduction, witness, engines."""
