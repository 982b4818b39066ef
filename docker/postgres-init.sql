-- Run once by the postgres image on an empty data volume: MLflow's database is POSTGRES_DB (mlflow);
-- Optuna's study storage gets its own database, owned by the same user.
CREATE DATABASE optuna OWNER sweep;
