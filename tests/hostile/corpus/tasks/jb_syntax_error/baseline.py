def create_inputs(:
