"""Turn records, the trajectory manager, linearization into training samples, and golden rendering."""
