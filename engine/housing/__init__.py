"""The house-price lab: train the house-price model in any mode and keep its weights (train), and price a house with
them (predict). The model and its dataset are building blocks in engine/workloads (house_price, housing_data)."""
