from django.urls import path

from overview import views

urlpatterns = [
    path("overview/", views.overview_page, name="overview"),
]
