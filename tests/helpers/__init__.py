"""What the tests share: data files in each task's schema, small models, runs started as a user starts them.
Test modules import from here, never from each other."""
