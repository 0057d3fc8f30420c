"""Tasks: problem sets (prompts, reference solutions, canonical answers) and answer grading."""
