"""The evaluation battery (`tokentop eval`)."""
