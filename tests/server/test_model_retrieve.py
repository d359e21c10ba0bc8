"""GET /v1/models/{id} (the openai client's `models.retrieve`): the card /v1/models lists, or a 404."""

from __future__ import annotations

import httpx
import openai
import pytest


def test_retrieve_gives_the_card_that_the_list_holds(openai_client, server):
    listed = openai_client.models.list().data
    card = openai_client.models.retrieve(server.model)
    assert [card] == listed
    assert card.id == server.model and card.object == "model" and card.owned_by == "pagedinfer"


def test_an_unknown_model_is_a_404_in_openais_error_shape(openai_client, server):
    with pytest.raises(openai.NotFoundError) as caught:
        openai_client.models.retrieve("gpt-4o")
    error = caught.value.body
    assert error["code"] == "model_not_found" and error["param"] == "model", error
    assert "gpt-4o" in error["message"] and server.model in error["message"]
    # an id with a slash (a Hub id) reaches the route too, rather than the router's own 404
    slashed = httpx.get(server.url + "/v1/models/org/name", timeout=10)
    assert slashed.status_code == 404 and slashed.json()["error"]["code"] == "model_not_found"
