"""The seeds' entry points, as the seed documents call them (`Trainer(config)`,
`TrainerFactory().create_trainer(...)`, `UnifiedTrainer(config).train_all_layers(...)`,
`ModelTrainer(config).train(...)`): each builds and runs our real components from a config."""
